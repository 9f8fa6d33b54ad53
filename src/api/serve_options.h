// The option tables of `wan serve` and of one video request (POST /v1/videos), built from generate's
// rows so the server and the CLI validate a value the same way. serve takes the rows that say which
// model to load and where (--model, the component files, --weights random --config, --device, ...);
// a request takes the OpenAI Videos fields and the generation extensions, under their API names. No
// request row is a path: a request can never name a file on the server.
#pragma once
#include <string>
#include <vector>

#include "api/options.h"

namespace wan::api {

const CommandSpec& serve_spec();
// The fields of POST /v1/videos (strings or numbers in JSON, strings in multipart); input_reference is
// an uploaded file and has no row.
const CommandSpec& video_request_spec();

// A request field that is a generate row under another name (or the same): the one table both the
// request rows and the request -> generate conversion are built from.
struct RequestRename {
  std::string field;     // the API's name ("num_frames")
  std::string generate;  // generate's row ("frames")
  std::string help;      // the request row's help ("" : none)
};
const std::vector<RequestRename>& video_request_renames();

// serve's model rows (those it shares with generate) as generate Values: the base every request's
// options start from.
Values generate_base_values(const Values& serve);

// "90", "90s", "15m", "24h", "7d" -> seconds (>= 0); throws OptionError for `key`.
double parse_duration(const std::string& s, const std::string& key);

}  // namespace wan::api
