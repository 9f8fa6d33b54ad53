// The API's objects that need no HTTP library: the video object and the /metrics text (http_server.h).
#include <sstream>

#include "server/http_server.h"

namespace wan::server {

nlohmann::json video_object(const JobInfo& j) {
  nlohmann::json o = {{"id", j.id},
                      {"object", "video"},
                      {"model", j.model},
                      {"status", state_name(j.state)},
                      {"progress", j.progress},
                      {"created_at", j.created_at},
                      {"completed_at", nullptr},
                      {"expires_at", nullptr},
                      {"size", j.size},
                      {"seconds", j.seconds},
                      {"prompt", j.prompt},
                      {"remixed_from_video_id", nullptr},
                      {"error", nullptr}};
  if (j.completed_at > 0) o["completed_at"] = j.completed_at;
  if (j.expires_at > 0) o["expires_at"] = j.expires_at;
  if (j.state == JobState::Failed) o["error"] = {{"code", j.error_code}, {"message", j.error_message}};
  return o;
}

std::string metrics_text(const QueueStats& s, bool draining) {
  std::ostringstream m;
  m << "# HELP wan_jobs Jobs the server knows, by state.\n# TYPE wan_jobs gauge\n";
  for (const auto& [st, n] : s.by_state) m << "wan_jobs{state=\"" << state_name(st) << "\"} " << n << "\n";
  m << "# HELP wan_queue_depth Jobs waiting for the worker.\n# TYPE wan_queue_depth gauge\n"
    << "wan_queue_depth " << s.queue_depth << "\n"
    << "# HELP wan_job_seconds Run time of finished jobs.\n# TYPE wan_job_seconds summary\n"
    << "wan_job_seconds_sum " << s.job_seconds_sum << "\nwan_job_seconds_count " << s.job_seconds_count << "\n"
    << "# HELP wan_step_seconds Denoising step time.\n# TYPE wan_step_seconds summary\n"
    << "wan_step_seconds_sum " << s.step_seconds_sum << "\nwan_step_seconds_count " << s.step_seconds_count << "\n"
    << "# HELP wan_jobs_accepted_total Jobs accepted since start.\n# TYPE wan_jobs_accepted_total counter\n"
    << "wan_jobs_accepted_total " << s.accepted << "\n"
    << "# HELP wan_jobs_rejected_total Requests refused with 429 (queue full).\n"
    << "# TYPE wan_jobs_rejected_total counter\nwan_jobs_rejected_total " << s.rejected_full << "\n"
    << "# HELP wan_ready 1 while accepting jobs.\n# TYPE wan_ready gauge\nwan_ready " << (draining ? 0 : 1) << "\n";
  return m.str();
}

}  // namespace wan::server
