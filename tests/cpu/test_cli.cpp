// The `msa` command-line tool, run as a subprocess: demo on small CPU shapes passes its own
// check, bench lists every named case, times custom CPU shapes into records of bench/SCHEMA.md
// and warns about dense selections, bad options exit 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "workloads/cases.h"
#include "msa/version.h"

namespace msa::test {
namespace {

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

// env: "NAME=value " assignments for the command, e.g. "MSA_COMMIT=abc ".
RunResult run_cli(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + std::string(MSA_CLI_PATH) + " " + args + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool has(const RunResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

// Runs `msa args` and expects exit code `code` and every one of `texts` in the output.
RunResult expect_run(const std::string& args, int code, const std::vector<std::string>& texts = {}) {
  const RunResult r = run_cli(args);
  EXPECT_EQ(r.code, code) << "msa " << args << "\n" << r.output;
  for (const std::string& t : texts)
    EXPECT_TRUE(has(r, t)) << "missing '" << t << "' from msa " << args << ":\n" << r.output;
  return r;
}

TEST(Cli, DemoRunsEveryStageAndPassesItsCheck) {
  expect_run("demo --device cpu --seq 256 --hq 4 --hkv 2 --topk 2", 0,
             {"index branch Hi=2 on 2 key heads", "block_topk", "build_k2q_csr", "attention_forward",
              "density:", "32 sampled (token, head) rows", "result: PASS"});
}

TEST(Cli, DemoIndexHeads) {
  const RunResult attn = expect_run("demo --device cpu --seq 200 --hq 4 --hkv 2 --topk 2 --index-heads 0", 0);
  EXPECT_FALSE(has(attn, "index branch")) << attn.output;  // scores with the attention heads
  expect_run("demo --device cpu --seq 200 --hq 4 --hkv 2 --topk 2 --index-heads 8", 0,
             {"index branch Hi=8 on 2 key heads"});
  expect_run("demo --device cpu --seq 200 --hq 4 --hkv 2 --index-heads 3", 2,
             {"--index-heads 3 must be 0 or Hkv times 1, 2, 4, 8 or 16"});
}

TEST(Cli, DemoVarlenNonCausalBlk64) {
  expect_run("demo --device cpu --seqlens 130,1,257 --causal 0 --blk 64 --hq 2 --hkv 1 --topk 3", 0,
             {"B=3 S=130,1,257", "result: PASS"});
}

TEST(Cli, DemoGpuWithoutGpuIsAnError) {
  if (built_with_cuda() && cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  expect_run("demo --device gpu --seq 128", 1, {"--device gpu, but"});
}

TEST(Cli, BenchListNamesEveryCase) {
  std::vector<std::string> names = {"gpu: "};
  for (const bench::BenchCase& c : bench::bench_cases()) names.push_back(c.name);
  expect_run("bench --list", 0, names);
}

TEST(Cli, BenchCaseWithoutBackendSaysWhatItNeeds) {
  if (built_with_cuda() && cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  expect_run("bench --case P32K-tok", 0, {"P32K-tok: needs the CUDA sparse prefill"});
  expect_run("bench --case DEC-B32 --device cpu", 0, {"prefill stages only"});
  expect_run("bench --case TOKSPARSE-32K", 0,
             {"TOKSPARSE-32K: needs the CUDA token-sparse prefill (attention_forward, kv_block_size 1)"});
  expect_run("bench --case TOKSPARSE-8K --device cpu", 0, {"not token ids"});
}

// The GPU runner of `msa bench` times the named prefill shapes only: with a shape option the
// case names that reason (CUDA builds) or the missing backend (CPU builds), never a silent
// switch to another shape.
TEST(Cli, BenchGpuRunnerRefusesShapeOverrides) {
  expect_run("bench --case P8K-tok --seq 4096 --device gpu", 0,
             {built_with_cuda() ? "drop the shape options" : "no CUDA backend"});
}

// The records of a JSON Lines file, each parsed.
std::vector<nlohmann::json> read_records(const std::string& path) {
  std::vector<nlohmann::json> v;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) v.push_back(nlohmann::json::parse(line));
  return v;
}

TEST(Cli, BenchTimesCustomCpuShapeAndAppendsSchemaRecords) {
  const std::string path = ::testing::TempDir() + "msa_cli_bench.jsonl";
  std::remove(path.c_str());
  const std::string args = "bench --device cpu --seq 256 --hq 4 --hkv 1 --topk 2 --pattern blk --iters 2 --json " + path;
  const RunResult r = run_cli(args, "MSA_COMMIT=test-commit ");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "attention_forward")) << r.output;
  std::vector<nlohmann::json> recs = read_records(path);
  ASSERT_EQ(recs.size(), 4u) << "one record per stage";
  std::set<std::string> ops;
  for (const nlohmann::json& j : recs) {
    for (const char* k : {"schema", "case", "impl", "op", "batch", "seq_q", "seq_k", "hq", "hkv", "d", "blk",
                          "topk", "pattern", "causal", "dtypes", "pairs", "density", "median_ms", "min_ms",
                          "max_ms", "iters", "warmup", "flop", "bytes", "tflops", "tbps", "metric", "check",
                          "flush", "commit", "device", "gpu", "driver", "cuda", "date"})
      EXPECT_TRUE(j.contains(k)) << "missing " << k << " in " << j.dump();
    EXPECT_EQ(j["schema"], 1);
    EXPECT_EQ(j["case"], "custom");
    EXPECT_EQ(j["impl"], "msa");
    EXPECT_EQ(j["seq_k"], 256);
    EXPECT_EQ(j["pattern"], "blk");
    EXPECT_EQ(j["dtypes"]["q"], "bf16");
    EXPECT_EQ(j["iters"], 2);
    EXPECT_EQ(j["check"], "skipped");
    EXPECT_EQ(j["flush"], "none");
    EXPECT_EQ(j["device"], "cpu");
    EXPECT_TRUE(j["gpu"].is_null());
    EXPECT_EQ(j["commit"], "test-commit");
    EXPECT_TRUE(std::regex_match(j["date"].get<std::string>(), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
        << j["date"];
    EXPECT_GT(j["median_ms"].get<double>(), 0.0);
    EXPECT_GT(j["bytes"].get<double>(), 0.0);
    ops.insert(j["op"].get<std::string>());
    if (j["op"] == "attention_forward") {
      EXPECT_GT(j["flop"].get<double>(), 0.0);
      EXPECT_EQ(j["metric"], "tflops");
      // The rate is the count over the median.
      EXPECT_NEAR(j["tflops"].get<double>(), j["flop"].get<double>() / (j["median_ms"].get<double>() * 1e9),
                  1e-9 * j["tflops"].get<double>());
    }
    if (j["op"] == "select_topk") {
      EXPECT_TRUE(j["flop"].is_null());
      EXPECT_EQ(j["metric"], "tbps");
    }
  }
  EXPECT_EQ(ops, (std::set<std::string>{"block_scores", "select_topk", "build_k2q_csr", "attention_forward"}));
  // A second run appends.
  EXPECT_EQ(run_cli(args).code, 0);
  recs = read_records(path);
  ASSERT_EQ(recs.size(), 8u);
  EXPECT_NE(recs.back()["commit"], "test-commit") << "the build's commit without MSA_COMMIT";
}

// Two blocks and topK 2: every visible pair is attended, so the "sparse" run is dense attention.
TEST(Cli, BenchWarnsAboutADenseSelectionOnly) {
  expect_run("bench --device cpu --seq 256 --hq 4 --hkv 1 --topk 2 --blk 128 --iters 1", 0,
             {"warning: the selection is dense: it covers 100.0%", "topK 2 >= 2 key blocks"});
  const RunResult sparse = expect_run("bench --device cpu --seq 1024 --hq 4 --hkv 1 --topk 2 --blk 128 --iters 1", 0);
  EXPECT_FALSE(has(sparse, "the selection is dense")) << sparse.output;
}

TEST(Cli, HelpExitsZero) {
  for (const char* cmd : {"--help", "demo --help", "bench --help"}) expect_run(cmd, 0, {"usage: msa"});
}

TEST(Cli, BadUsageExitsTwoWithAMessage) {
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      {"", "usage: msa"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"demo --bogus", "unknown option --bogus"},
      {"demo --seq", "--seq needs a value"},
      {"demo --seq 12x", "--seq: expected an integer, got '12x'"},
      {"demo --hq 6 --hkv 4", "--hq 6 must be a multiple of --hkv 4"},
      {"demo --causal 2", "--causal: must be one of 0|1"},
      {"demo --device tpu", "--device: must be one of cpu|gpu|auto"},
      {"bench", "give --case NAME, --list, or a custom shape"},
      {"bench --case NOPE", "unknown case 'NOPE'"},
      {"bench --seq 64 --pattern zig", "--pattern: must be one of tok|blk|idx"},
      // Refused before any stage runs, not by a stage after others ran.
      {"demo --seq 256 --dim 7", "--dim must be a multiple of 16"},
      {"demo --seq 256 --topk 1", "--topk must be >= 2"},
      {"demo --seq 1073741824", "GB of host memory"},
      {"bench --case P32K-tok --device cpu", "or pass --allow-slow"},
      // G = 64 and token ids lie outside the CLI's block shapes: the case runs as the table has it.
      {"bench --case TOKSPARSE-8K --seq 4096", "TOKSPARSE-8K takes no shape options"},
  };
  for (const auto& c : cases) expect_run(c.args, 2, {c.message});
}

}  // namespace
}  // namespace msa::test
