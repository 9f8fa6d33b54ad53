// The option tables (src/api/options.h): help generated from a table, argv and JSON parsed against the
// same table with the same validation, the hidden aliases, the value parsers the tables share, the
// generate table's translation into GenerateOptions, and every command's help through the built
// binary (`wan help CMD`, `wan CMD --help`, `wan CMD -h`).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "api/commands.h"
#include "api/options.h"
#include "core/error.h"
#include "run_util.h"

namespace {

using namespace wan::api;

const CommandSpec& demo() {
  static const CommandSpec s = [] {
    CommandSpec c;
    c.name = "demo";
    c.summary = "a table for the tests";
    c.usage = {"demo --name TEXT [options]"};
    c.about = "Demonstrates the table.";
    Option name = option("name", Kind::String, "TEXT", "", "a required text");
    name.required = true;
    Option frames = option("frames", Kind::Int, "N", "81", "4n+1 frames");
    frames.min = 1;
    frames.max = 1000;
    frames.check = [](const std::string& t) {
      return (std::stoll(t) - 1) % 4 == 0 ? std::string() : "{}: must be 4n+1, got " + t;
    };
    Option mode = option("mode", Kind::Enum, "", "fast", "how to run");
    mode.choices = {"fast", "slow"};
    Option output = option("output", Kind::Path, "FILE", "out.txt", "where to write");
    output.aliases = {"out"};
    Option secret = option("secret", Kind::String, "X", "", "never listed");
    secret.hidden = true;
    Option tag = option("tag", Kind::String, "T", "", "repeatable");
    tag.repeatable = true;
    tag.check = [](const std::string& t) { return t.empty() ? std::string("{}: empty") : std::string(); };
    c.options = {name,
                 tag,
                 frames,
                 option("scale", Kind::Float, "S", "1.5", "a number"),
                 option("size", Kind::Size, "WxH", "64x32", "a size"),
                 mode,
                 option("device", Kind::Device, "DEV", "cpu", "cpu | cuda[:i]"),
                 option("items", Kind::List, "", "", "a list"),
                 flag_option("quiet",
                             "say nothing; a long help text that must wrap onto a second line because it "
                             "is far wider than the help's one hundred and eight columns allow"),
                 output,
                 secret};
    c.epilog = "The end.";
    return c;
  }();
  return s;
}

Values argv_of(std::vector<std::string> args) {
  args.insert(args.begin(), "demo");
  std::vector<char*> p;
  for (std::string& a : args) p.push_back(a.data());
  return parse_argv(demo(), static_cast<int>(p.size()), p.data());
}

std::string argv_error(const std::vector<std::string>& args) {
  try {
    argv_of(args);
  } catch (const wan::Error& e) {
    EXPECT_EQ(e.kind(), wan::ErrorKind::BadInput);
    return e.what();
  }
  return "(no error)";
}

std::string json_error(const nlohmann::json& j) {
  try {
    parse_json(demo(), j);
  } catch (const wan::Error& e) {
    EXPECT_EQ(e.kind(), wan::ErrorKind::BadInput);
    return e.what();
  }
  return "(no error)";
}

TEST(Options, HelpComesFromTheTable) {
  const std::string h = help_text(demo());
  EXPECT_EQ(h.rfind("usage: wan demo --name TEXT [options]\n  Demonstrates the table.\n", 0), 0u) << h;
  for (const char* s : {"  --name TEXT               a required text (required)\n",
                        "  --frames N                4n+1 frames (default: 81)\n", "  --mode fast|slow",
                        "  --size WxH                a size (default: 64x32)\n", "--output FILE", "--items A,B,...",
                        "  -h, --help                show this help\n", "\nThe end.\n"})
    EXPECT_NE(h.find(s), std::string::npos) << s << "\n" << h;
  EXPECT_EQ(h.find("--secret"), std::string::npos) << "hidden rows are not listed";
  EXPECT_EQ(h.find("--out "), std::string::npos) << "aliases are not listed";
  size_t start = 0, lines = 0;
  for (size_t nl = h.find('\n'); nl != std::string::npos; start = nl + 1, nl = h.find('\n', start), ++lines)
    EXPECT_LE(nl - start, 108u) << h.substr(start, nl - start);
  // The long help wraps at the column of the descriptions.
  EXPECT_NE(h.find("\n                            "), std::string::npos) << h;
}

TEST(Options, ArgvParsesBothFormsAndFlags) {
  const Values v = argv_of({"--name", "a b", "--frames=9", "--quiet", "--scale", "2.5", "--size=1280*720", "--device",
                            "cuda:1", "--items", "x,y,z"});
  EXPECT_EQ(v.require("name"), "a b");
  EXPECT_EQ(v.get_int("frames", 0), 9);
  EXPECT_TRUE(v.flag("quiet"));
  EXPECT_DOUBLE_EQ(v.get_double("scale", 0), 2.5);
  EXPECT_EQ(v.size("size"), (std::pair<int, int>{1280, 720}));
  EXPECT_EQ(v.device("device"), 1);
  EXPECT_EQ(v.list("items"), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_FALSE(v.has("mode"));
  EXPECT_EQ(v.str("mode"), "fast") << "the table's default";
  EXPECT_EQ(v.size("size").first, 1280);
  EXPECT_FALSE(v.help());
  // --name=value keeps everything after the first '='.
  EXPECT_EQ(argv_of({"--name=x=y"}).require("name"), "x=y");
}

TEST(Options, ArgvErrorsNameTheOption) {
  EXPECT_EQ(argv_error({"--name", "n", "--bogus", "1"}), "unknown option --bogus (see 'wan demo --help')");
  EXPECT_EQ(argv_error({"--name"}), "option --name needs a value");
  EXPECT_EQ(argv_error({"--name", "n", "--frames", "ten"}), "option --frames: 'ten' is not an integer");
  EXPECT_EQ(argv_error({"--name", "n", "--frames", "10"}), "--frames: must be 4n+1, got 10");
  EXPECT_EQ(argv_error({"--name", "n", "--frames", "0"}), "--frames 0: expected 1..1000");
  EXPECT_EQ(argv_error({"--name", "n", "--frames=2001"}), "--frames 2001: expected 1..1000");
  EXPECT_EQ(argv_error({"--name", "n", "--scale", "x"}), "option --scale: 'x' is not a number");
  // Not "not a number": the value parses, it is just not finite.
  EXPECT_EQ(argv_error({"--name", "n", "--scale", "inf"}), "option --scale: 'inf' must be a finite number");
  EXPECT_EQ(argv_error({"--name", "n", "--scale=nan"}), "option --scale: 'nan' must be a finite number");
  // A forgotten value is named as such, not reported as an unexpected argument further on.
  EXPECT_EQ(argv_error({"--name", "--output", "o.txt"}),
            "option --name needs a value, but the next argument is the option --output (write --name=VALUE for a "
            "value that starts with --)");
  EXPECT_EQ(argv_error({"--name", "--frames=5"}).rfind("option --name needs a value, but", 0), 0u);
  EXPECT_EQ(argv_error({"--name", "--help"}).rfind("option --name needs a value, but", 0), 0u);
  EXPECT_EQ(argv_error({"--name=--output", "--frames", "5"}), "(no error)");
  EXPECT_EQ(argv_error({"--name", "--not-an-option"}), "(no error)");  // an unknown --word is a value
  // Text options must be UTF-8; the message quotes the text printably and says where it breaks.
  EXPECT_EQ(argv_error({"--name", "caf\xe9 au lait"}),
            "option --name: not valid UTF-8 (byte 0xE9 at offset 3 of \"caf\\xE9 au lait\")");
  EXPECT_EQ(argv_error({"--name", "caf\xc3\xa9"}), "(no error)");
  EXPECT_EQ(argv_error({"--name", "n", "--mode", "warp"}), "unknown --mode 'warp' (valid: fast, slow)");
  EXPECT_EQ(argv_error({"--name", "n", "--size", "64"}),
            "--size: '64' is not WIDTHxHEIGHT (e.g. 1280x720 or 1280*720)");
  EXPECT_EQ(argv_error({"--name", "n", "--device", "gpu"}), "--device 'gpu' is not cpu, cuda or cuda:<index>");
  EXPECT_EQ(argv_error({"--name", "n", "--quiet=1"}), "option --quiet takes no value");
  EXPECT_EQ(argv_error({"--name", "n", "stray"}), "unexpected argument 'stray' (options start with --; see --help)");
  EXPECT_EQ(argv_error({"--frames", "5"}), "missing required option --name");
  // Help needs no required option.
  EXPECT_TRUE(argv_of({"-h"}).help());
  EXPECT_TRUE(argv_of({"--frames", "5", "--help"}).help());
}

TEST(Options, AliasParsesAsTheName) {
  EXPECT_EQ(argv_of({"--name", "n", "--out", "a.txt"}).get("output"), "a.txt");
  EXPECT_EQ(argv_of({"--name", "n", "--out=b.txt"}).get("output"), "b.txt");
  EXPECT_EQ(parse_json(demo(), {{"name", "n"}, {"out", "c.txt"}}).get("output"), "c.txt");
  EXPECT_EQ(argv_error({"--name", "n", "--out"}), "option --output needs a value");
}

TEST(Options, RepeatableKeepsEveryValueInOrder) {
  const Values a = argv_of({"--name", "n", "--tag", "x:1", "--tag=y", "--tag", "x:1"});
  EXPECT_EQ(a.all("tag"), (std::vector<std::string>{"x:1", "y", "x:1"}));
  EXPECT_EQ(argv_of({"--name", "n"}).all("tag"), std::vector<std::string>{});
  EXPECT_EQ(argv_of({"--name", "n", "--frames", "5", "--frames", "9"}).get_int("frames", 0), 9);  // not repeatable
  EXPECT_EQ(argv_error({"--name", "n", "--tag", "a", "--tag="}), "--tag: empty");
  EXPECT_EQ(parse_json(demo(), {{"name", "n"}, {"tag", {"p", "q"}}}).all("tag"), (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(parse_json(demo(), {{"name", "n"}, {"tag", "p"}}).all("tag"), std::vector<std::string>{"p"});
  EXPECT_EQ(json_error({{"name", "n"}, {"tag", {"p", 3}}}), "'tag': expected strings, got 3");
}

TEST(Options, JsonUsesTheSameTableAndChecks) {
  const Values v = parse_json(demo(), {{"name", "n"},
                                       {"frames", 13},
                                       {"quiet", true},
                                       {"scale", 0.25},
                                       {"size", "832x480"},
                                       {"items", {"a", 2}},
                                       {"device", "cuda"}});
  EXPECT_EQ(v.require("name"), "n");
  EXPECT_EQ(v.get_int("frames", 0), 13);
  EXPECT_TRUE(v.flag("quiet"));
  EXPECT_DOUBLE_EQ(v.get_double("scale", 0), 0.25);
  EXPECT_EQ(v.size("size"), (std::pair<int, int>{832, 480}));
  EXPECT_EQ(v.list("items"), (std::vector<std::string>{"a", "2"}));
  EXPECT_EQ(v.device("device"), 0);
  EXPECT_FALSE(parse_json(demo(), {{"name", "n"}, {"quiet", false}}).flag("quiet"));
  // The same checks, the option named the JSON way.
  EXPECT_EQ(json_error({{"name", "n"}, {"frames", 10}}), "'frames': must be 4n+1, got 10");
  EXPECT_EQ(json_error({{"name", "n"}, {"frames", 0}}), "'frames' 0: expected 1..1000");
  EXPECT_EQ(json_error({{"name", "n"}, {"frames", "9"}}), "'frames': expected an integer, got \"9\"");
  EXPECT_EQ(json_error({{"name", "n"}, {"quiet", 1}}), "'quiet': expected a boolean, got 1");
  EXPECT_EQ(json_error({{"name", "n"}, {"mode", "warp"}}), "unknown 'mode' 'warp' (valid: fast, slow)");
  EXPECT_EQ(json_error({{"name", "n"}, {"size", "64"}}),
            "'size': '64' is not WIDTHxHEIGHT (e.g. 1280x720 or 1280*720)");
  EXPECT_EQ(json_error({{"name", "n"}, {"bogus", 1}}), "unknown param 'bogus' for demo");
  EXPECT_EQ(json_error({{"frames", 5}}), "missing required param 'name'");
  EXPECT_EQ(json_error(nlohmann::json::array()), "demo: the request must be a JSON object, got array");
}

TEST(Options, DeeperErrorsNameTheOptionThroughTheTable) {
  const OptionError e("frames", "{}: must be 4n+1, got 10");
  EXPECT_STREQ(e.what(), "--frames: must be 4n+1, got 10");
  EXPECT_EQ(e.key(), "frames");
  EXPECT_EQ(json_error_message(demo(), e), "'frames': must be 4n+1, got 10");
  // A plain wan::Error that starts with a table option is renamed; other messages pass through.
  EXPECT_EQ(json_error_message(demo(), wan::Error("--size 100x64: width and height must be multiples of 16")),
            "'size' 100x64: width and height must be multiples of 16");
  EXPECT_EQ(json_error_message(demo(), wan::Error("--model: missing")), "--model: missing");
  EXPECT_EQ(json_error_message(demo(), wan::Error("disk full")), "disk full");
}

// Context added on the way out (WAN_WITH_CONTEXT) keeps the error an OptionError with its key.
TEST(Options, ContextKeepsTheOptionKey) {
  try {
    WAN_WITH_CONTEXT("planning", WAN_THROW_OPTION("steps", "{}: must be at least 1, got 0"));
    FAIL() << "no throw";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), "steps");
    EXPECT_STREQ(e.what(), "planning: --steps: must be at least 1, got 0");
    EXPECT_EQ(e.json_message(), "planning: 'steps': must be at least 1, got 0");
  }
}

// The pipeline's own checks throw the keyed OptionError (core/error.h), so a JSON front end names the
// option its way without any renaming; the command line still reads "--key".
TEST(Options, PipelineChecksThrowTheKeyedError) {
  const auto keyed = [](wan::GenerateOptions o, const std::string& key, const std::string& json_start) {
    o.random_weights = true;
    o.config = "tiny";
    o.prompt = "a cat";
    try {
      (void)wan::plan_generate(o);
      ADD_FAILURE() << "no error for " << key;
    } catch (const OptionError& e) {
      EXPECT_EQ(e.key(), key);
      EXPECT_EQ(std::string(e.what()).rfind("--" + key, 0), 0u) << e.what();
      EXPECT_EQ(e.json_message().rfind(json_start, 0), 0u) << e.json_message();
    }
  };
  wan::GenerateOptions a;
  a.keep_text_encoder = true;  // CPU run
  keyed(a, "keep-text-encoder", "'keep-text-encoder': only with --device cuda");
  wan::GenerateOptions b;
  b.width = 100, b.height = 64;
  keyed(b, "size", "'size' 100x64:");
  wan::GenerateOptions c;
  c.steps = 20000;
  keyed(c, "steps", "'steps' 20000: must be in 1..10000");
  wan::GenerateOptions d;
  d.memory_budget = int64_t{24} << 30;  // CPU run
  keyed(d, "memory-budget", "'memory-budget': only with --device cuda");
  wan::GenerateOptions e;
  e.host_memory_budget = int64_t{24} << 30;
  keyed(e, "host-memory-budget", "'host-memory-budget': only with --device cuda");
}

TEST(Options, MemoryBudgetSizes) {
  using wan::api::parse_memory_size;
  EXPECT_EQ(parse_memory_size("24GiB", "memory-budget"), int64_t{24} << 30);
  EXPECT_EQ(parse_memory_size("24G", "memory-budget"), int64_t{24} << 30);
  EXPECT_EQ(parse_memory_size("1.5G", "memory-budget"), int64_t{3} << 29);
  EXPECT_EQ(parse_memory_size("16000MiB", "memory-budget"), int64_t{16000} << 20);
  EXPECT_EQ(parse_memory_size("24GB", "memory-budget"), int64_t{24000000000});
  EXPECT_EQ(parse_memory_size("4096", "memory-budget"), 4096);
  for (const char* bad : {"", "G", "24X", "-1G", "0", "0GiB", "1e30G", "nanG", "24 GiBs"})
    EXPECT_THROW(parse_memory_size(bad, "memory-budget"), OptionError) << bad;
  auto budget_of = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "--model", "m", "--prompt", "x"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> p;
    for (std::string& a : args) p.push_back(a.data());
    wan::ParallelArgs pa;
    const wan::GenerateOptions o =
        generate_options(parse_argv(generate_spec(), static_cast<int>(p.size()), p.data()), &pa);
    return std::pair{o.memory_budget, o.host_memory_budget};
  };
  EXPECT_EQ(budget_of({}), (std::pair<int64_t, int64_t>{0, 0}));
  EXPECT_EQ(budget_of({"--memory-budget", "24GiB", "--host-memory-budget", "64G"}),
            (std::pair<int64_t, int64_t>{int64_t{24} << 30, int64_t{64} << 30}));
  try {
    budget_of({"--memory-budget", "lots"});
    ADD_FAILURE() << "a bad size accepted";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), "memory-budget");
  }
}

TEST(Options, VaeTile) {
  using wan::VaeTileRequest;
  EXPECT_EQ(parse_vae_tile("auto", "vae-tile").mode, VaeTileRequest::Auto);
  EXPECT_EQ(parse_vae_tile("off", "vae-tile").mode, VaeTileRequest::Off);
  const VaeTileRequest r = parse_vae_tile("512x384", "vae-tile");
  EXPECT_EQ(r.mode, VaeTileRequest::Fixed);
  EXPECT_EQ(r.width, 512);
  EXPECT_EQ(r.height, 384);
  EXPECT_EQ(parse_vae_tile("256", "vae-tile"), (VaeTileRequest{VaeTileRequest::Fixed, 256, 256}));
  for (const char* bad : {"", "on", "Auto", "64", "100", "512x", "x512", "512x500", "512x384x2", "-256", "256.0",
                          "1e3", "512 x 384", "99999999999"})
    EXPECT_THROW(parse_vae_tile(bad, "vae-tile"), OptionError) << bad;
  auto tile_of = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "--model", "m", "--prompt", "x"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> p;
    for (std::string& a : args) p.push_back(a.data());
    wan::ParallelArgs pa;
    return generate_options(parse_argv(generate_spec(), static_cast<int>(p.size()), p.data()), &pa).vae_tile;
  };
  EXPECT_EQ(tile_of({}).mode, VaeTileRequest::Auto);
  EXPECT_EQ(tile_of({"--vae-tile", "off"}).mode, VaeTileRequest::Off);
  EXPECT_EQ(tile_of({"--vae-tile", "384x256"}), (VaeTileRequest{VaeTileRequest::Fixed, 384, 256}));
  try {
    tile_of({"--vae-tile", "300x300"});
    ADD_FAILURE() << "a bad tile accepted";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), "vae-tile");
  }
}

TEST(Options, ValueParsers) {
  EXPECT_EQ(parse_size("1280x720").width, 1280);
  EXPECT_EQ(parse_size("1280x720").height, 720);
  EXPECT_EQ(parse_size("480*832").width, 480);
  EXPECT_EQ(parse_size("480*832").height, 832);
  for (const char* bad : {"1280", "x720", "1280x", "12a0x720", "-16x16", "0x16", "16x16x16"}) {
    try {
      parse_size(bad);
      ADD_FAILURE() << bad;
    } catch (const OptionError& e) {
      EXPECT_EQ(e.key(), "size");
      EXPECT_EQ(std::string(e.what()).rfind("--size", 0), 0u) << e.what();
    }
  }
  EXPECT_EQ(parse_guide_scale("5"), (std::pair<float, float>{5.0f, 5.0f}));
  EXPECT_EQ(parse_guide_scale("3,4.5"), (std::pair<float, float>{3.0f, 4.5f}));
  for (const char* bad : {"", "a", "3,", ",4", "3;4", "nan"}) EXPECT_THROW(parse_guide_scale(bad), OptionError) << bad;
  try {
    (void)parse_guide_scale("inf");
    ADD_FAILURE() << "inf accepted";
  } catch (const OptionError& e) {
    EXPECT_STREQ(e.what(), "--guide-scale: 'inf' must be a finite number");
  }
  EXPECT_EQ(parse_device("cpu"), -1);
  EXPECT_EQ(parse_device("cuda"), 0);
  EXPECT_EQ(parse_device("cuda:3"), 3);
  EXPECT_EQ(parse_device("2", "device", true), 2);
  for (const char* bad : {"gpu", "2", "cuda:", "cuda:x", "cuda:123456", "CPU"})
    EXPECT_THROW(parse_device(bad), OptionError) << bad;
}

TEST(Options, GenerateTableGivesTheSameOptionsFromArgvAndJson) {
  std::vector<std::string> args = {"generate", "--model",  "m",         "--prompt",  "a fox",          "--size",
                                   "832x480",  "--frames", "9",         "--steps=4", "--guide-scale",  "3,4.5",
                                   "--seed",   "7",        "--device",  "cuda:1",    "--timings-json", "t.json",
                                   "--gpus",   "2",        "--ulysses", "2"};
  std::vector<char*> p;
  for (std::string& a : args) p.push_back(a.data());
  const Values a = parse_argv(generate_spec(), static_cast<int>(p.size()), p.data());
  EXPECT_EQ(a.get("json"), "t.json") << "--timings-json is the older spelling of --json";
  const Values j = parse_json(generate_spec(), {{"model", "m"},
                                                {"prompt", "a fox"},
                                                {"size", "832x480"},
                                                {"frames", 9},
                                                {"steps", 4},
                                                {"guide-scale", "3,4.5"},
                                                {"seed", 7},
                                                {"device", "cuda:1"},
                                                {"json", "t.json"},
                                                {"gpus", "2"},
                                                {"ulysses", "2"}});
  for (const Values* v : {&a, &j}) {
    wan::ParallelArgs pa;
    const wan::GenerateOptions o = generate_options(*v, &pa);
    EXPECT_EQ(o.model, "m");
    EXPECT_EQ(o.prompt, "a fox");
    EXPECT_EQ(o.width, 832);
    EXPECT_EQ(o.height, 480);
    EXPECT_EQ(o.frames, 9);
    EXPECT_EQ(o.steps, 4);
    EXPECT_EQ(o.guide_low, 3.0f);
    EXPECT_EQ(o.guide_high, 4.5f);
    EXPECT_EQ(o.seed, 7u);
    EXPECT_EQ(o.device, "cuda:1");
    EXPECT_FALSE(o.shift.has_value()) << "absent options keep the pipeline's defaults";
    EXPECT_EQ(pa.gpus, "2");
    EXPECT_EQ(pa.ulysses, "2");
    EXPECT_EQ(pa.device, "cuda:1");
  }
  try {
    parse_json(generate_spec(), {{"frames", 10}});
    ADD_FAILURE() << "frames 10 accepted";
  } catch (const wan::Error& e) {
    EXPECT_EQ(std::string(e.what()), "'frames': must be 4n+1, got 10");
  }
}

// --gemm / --precision: the GEMM kind from either (default bf16), both must agree; argv and JSON alike.
TEST(Options, GemmAndPrecisionGiveTheGemmKind) {
  auto gemm_of = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "--model", "m", "--prompt", "x"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> p;
    for (std::string& a : args) p.push_back(a.data());
    wan::ParallelArgs pa;
    return generate_options(parse_argv(generate_spec(), static_cast<int>(p.size()), p.data()), &pa).gemm;
  };
  EXPECT_EQ(gemm_of({}), "bf16");
  EXPECT_EQ(gemm_of({"--gemm", "fp8"}), "fp8");
  EXPECT_EQ(gemm_of({"--precision", "fp8"}), "fp8");
  EXPECT_EQ(gemm_of({"--precision", "exact"}), "bf16");
  EXPECT_EQ(gemm_of({"--precision", "fp8", "--gemm", "fp8"}), "fp8");
  EXPECT_THROW(gemm_of({"--gemm", "fp16"}), OptionError);
  EXPECT_THROW(gemm_of({"--precision", "int8"}), OptionError);
  try {
    gemm_of({"--precision", "exact", "--gemm", "fp8"});
    ADD_FAILURE() << "a contradiction accepted";
  } catch (const OptionError& e) {
    EXPECT_NE(std::string(e.what()).find("--gemm fp8 contradicts --precision exact"), std::string::npos) << e.what();
  }
  wan::ParallelArgs pa;
  EXPECT_EQ(generate_options(parse_json(generate_spec(), {{"model", "m"}, {"prompt", "x"}, {"precision", "fp8"}}), &pa)
                .gemm,
            "fp8");
}

// ---- through the binary ----

const char* const kCommands[] = {"generate", "encode-prompt", "decode",    "inspect",         "make-checkpoint",
                                 "forward",  "bench",         "bench-vae", "bench-attention", "bench-load"};

wan::test::RunResult run_wan(const std::vector<std::string>& args) { return wan::test::run_captured(WAN_BINARY, args); }

TEST(OptionsCli, EveryCommandHasHelp) {
  if (!std::filesystem::exists(WAN_BINARY)) GTEST_SKIP() << "wan binary not built: " << WAN_BINARY;
  for (const std::string cmd : kCommands) {
    SCOPED_TRACE(cmd);
    const auto h = run_wan({"help", cmd});
    EXPECT_EQ(h.code, 0) << h.err;
    EXPECT_EQ(h.err, "");
    EXPECT_EQ(h.out.rfind("usage: wan " + cmd.substr(0, cmd == "bench-load" ? 5 : cmd.size()), 0), 0u) << h.out;
    EXPECT_NE(h.out.find("-h, --help"), std::string::npos) << h.out;
    for (const char* flag : {"--help", "-h"}) {
      const auto r = run_wan({cmd, flag});
      EXPECT_EQ(r.code, 0) << flag << ": " << r.err;
      EXPECT_EQ(r.out, h.out) << flag;
    }
  }
}

TEST(OptionsCli, TopLevelHelpListsTheCommands) {
  if (!std::filesystem::exists(WAN_BINARY)) GTEST_SKIP() << "wan binary not built: " << WAN_BINARY;
  for (const char* a : {"--help", "-h", "help"}) {
    const auto r = run_wan({a});
    EXPECT_EQ(r.code, 0) << a;
    for (const char* cmd : kCommands) EXPECT_NE(r.out.find(std::string("  ") + cmd + " "), std::string::npos) << cmd;
    EXPECT_EQ(r.out.find("on the CPU\n"), std::string::npos) << "generate runs on CPU or GPU:\n" << r.out;
  }
  const auto u = run_wan({"help", "nosuch"});
  EXPECT_EQ(u.code, 2);
  EXPECT_EQ(u.err, "error: unknown command 'nosuch' (try 'wan --help')\n");
}

TEST(OptionsCli, HelpIsConsistent) {
  if (!std::filesystem::exists(WAN_BINARY)) GTEST_SKIP() << "wan binary not built: " << WAN_BINARY;
  const auto bench = run_wan({"bench", "--help"});
  EXPECT_NE(bench.out.find("--load PATH"), std::string::npos) << bench.out;
  for (const char* s : {"issue", ".md"}) EXPECT_EQ(bench.out.find(s), std::string::npos) << s;
  for (const std::string cmd : kCommands) {
    const auto h = run_wan({"help", cmd});
    EXPECT_EQ(h.out.find("--out "), std::string::npos) << cmd << ": documents --output only";
    EXPECT_EQ(h.out.find("--timings-json"), std::string::npos) << cmd << ": documents --json only";
    EXPECT_EQ(h.out.find("--device N"), std::string::npos) << cmd << ": --device cpu|cuda[:i]";
  }
  for (const char* cmd : {"decode", "encode-prompt", "forward", "make-checkpoint"})
    EXPECT_NE(run_wan({"help", cmd}).out.find("--output "), std::string::npos) << cmd;
}

TEST(OptionsCli, BadOptionIsOneLineExit2) {
  if (!std::filesystem::exists(WAN_BINARY)) GTEST_SKIP() << "wan binary not built: " << WAN_BINARY;
  const auto r = run_wan({"forward", "--model", "x", "--frames", "10"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --frames: must be 4n+1, got 10\n");
  const auto m = run_wan({"make-checkpoint", "--config", "tiny", "--layout", "official"});
  EXPECT_EQ(m.code, 2);
  EXPECT_EQ(m.err, "error: missing required option --output\n");
}

}  // namespace
