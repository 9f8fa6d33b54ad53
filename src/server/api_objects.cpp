// The API's objects that need no HTTP library: the video object and the /metrics text (http_server.h).
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "pipeline/models.h"
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
  // An extension: where the job's time went (jobs.h JobInfo; null until reached).
  auto opt = [](double x) { return x < 0 ? nlohmann::json(nullptr) : nlohmann::json(x); };
  o["timings"] = {{"queue_s", opt(j.queue_seconds)},
                  {"first_step_s", opt(j.first_step_seconds)},
                  {"stages_s", opt(j.stage_seconds)},
                  {"run_s", j.state == JobState::Completed || j.state == JobState::Failed ? opt(j.run_seconds)
                                                                                          : nlohmann::json(nullptr)},
                  {"write_s", opt(j.write_seconds)},
                  {"worker", j.worker < 0 ? nlohmann::json(nullptr) : nlohmann::json(j.worker)}};
  return o;
}

MemoryGauges memory_gauges(const std::vector<int>& devices) {
  MemoryGauges g;
  long pages = 0, resident = 0;
  if (std::ifstream statm("/proc/self/statm"); statm >> pages >> resident)
    g.host_rss_bytes = static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
  for (int device : devices) {
    try {  // in use is what every process holds on the device, as nvidia-smi shows it
      MemoryGauges::Device d;
      d.index = device;
      d.used_bytes = gpu_memory_in_use(device);
      d.total_bytes = d.used_bytes + static_cast<int64_t>(gpu_free_bytes(device));
      g.devices.push_back(d);
    } catch (const std::exception&) {  // no device (a CPU build): the host gauge only
    }
  }
  return g;
}

std::string metrics_text(const QueueStats& s, bool draining, const MemoryGauges& mem) {
  std::ostringstream m;
  m << "# HELP wan_jobs Jobs the server knows, by state.\n# TYPE wan_jobs gauge\n";
  for (const auto& [st, n] : s.by_state) m << "wan_jobs{state=\"" << state_name(st) << "\"} " << n << "\n";
  m << "# HELP wan_queue_depth Jobs waiting for the worker.\n# TYPE wan_queue_depth gauge\n"
    << "wan_queue_depth " << s.queue_depth << "\n"
    << "# HELP wan_job_seconds Run time of finished jobs.\n# TYPE wan_job_seconds summary\n"
    << "wan_job_seconds_sum " << s.job_seconds_sum << "\nwan_job_seconds_count " << s.job_seconds_count << "\n"
    << "# HELP wan_step_seconds Denoising step time.\n# TYPE wan_step_seconds summary\n"
    << "wan_step_seconds_sum " << s.step_seconds_sum << "\nwan_step_seconds_count " << s.step_seconds_count << "\n"
    << "# HELP wan_first_step_seconds From a job's acceptance to its first denoising step.\n"
    << "# TYPE wan_first_step_seconds summary\nwan_first_step_seconds_sum " << s.first_step_seconds_sum
    << "\nwan_first_step_seconds_count " << s.first_step_seconds_count << "\n"
    << "# HELP wan_jobs_accepted_total Jobs accepted since start.\n# TYPE wan_jobs_accepted_total counter\n"
    << "wan_jobs_accepted_total " << s.accepted << "\n"
    << "# HELP wan_jobs_rejected_total Requests refused with 429 (queue full).\n"
    << "# TYPE wan_jobs_rejected_total counter\nwan_jobs_rejected_total " << s.rejected_full << "\n"
    << "# HELP wan_ready 1 while accepting jobs.\n# TYPE wan_ready gauge\nwan_ready " << (draining ? 0 : 1) << "\n";
  if (mem.host_rss_bytes >= 0)
    m << "# HELP wan_host_memory_rss_bytes Resident memory of the server process.\n"
      << "# TYPE wan_host_memory_rss_bytes gauge\nwan_host_memory_rss_bytes " << mem.host_rss_bytes << "\n";
  if (!mem.devices.empty()) {
    auto label = [](const MemoryGauges::Device& d) { return cat("{device=\"cuda:", d.index, "\"}"); };
    m << "# HELP wan_device_memory_used_bytes Device memory in use (cudaMemGetInfo: total - free).\n"
      << "# TYPE wan_device_memory_used_bytes gauge\n";
    for (const MemoryGauges::Device& d : mem.devices)
      m << "wan_device_memory_used_bytes" << label(d) << " " << d.used_bytes << "\n";
    m << "# HELP wan_device_memory_total_bytes Device memory in all.\n"
      << "# TYPE wan_device_memory_total_bytes gauge\n";
    for (const MemoryGauges::Device& d : mem.devices)
      m << "wan_device_memory_total_bytes" << label(d) << " " << d.total_bytes << "\n";
  }
  return m.str();
}

}  // namespace wan::server
