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

TEST(Cli, DemoRunsEveryStageAndPassesItsCheck) {
  const RunResult r = run_cli("demo --device cpu --seq 256 --hq 4 --hkv 2 --topk 2");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const char* s : {"index branch Hi=2 on 2 key heads", "block_topk", "build_k2q_csr",
                        "attention_forward", "density:", "32 sampled (token, head) rows",
                        "result: PASS"})
    EXPECT_TRUE(has(r, s)) << "missing '" << s << "' in:\n" << r.output;
}

TEST(Cli, DemoIndexHeads) {
  const RunResult attn = run_cli("demo --device cpu --seq 200 --hq 4 --hkv 2 --topk 2 --index-heads 0");
  EXPECT_EQ(attn.code, 0) << attn.output;
  EXPECT_FALSE(has(attn, "index branch")) << attn.output;  // scores with the attention heads
  const RunResult wide = run_cli("demo --device cpu --seq 200 --hq 4 --hkv 2 --topk 2 --index-heads 8");
  EXPECT_EQ(wide.code, 0) << wide.output;
  EXPECT_TRUE(has(wide, "index branch Hi=8 on 2 key heads")) << wide.output;
  const RunResult bad = run_cli("demo --device cpu --seq 200 --hq 4 --hkv 2 --index-heads 3");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_TRUE(has(bad, "--index-heads 3 must be 0 or Hkv times 1, 2, 4, 8 or 16")) << bad.output;
}

TEST(Cli, DemoVarlenNonCausalBlk64) {
  const RunResult r = run_cli("demo --device cpu --seqlens 130,1,257 --causal 0 --blk 64 --hq 2 --hkv 1 --topk 3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "B=3 S=130,1,257")) << r.output;
  EXPECT_TRUE(has(r, "result: PASS")) << r.output;
}

TEST(Cli, DemoGpuWithoutGpuIsAnError) {
  if (built_with_cuda() && cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  const RunResult r = run_cli("demo --device gpu --seq 128");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(has(r, "--device gpu, but")) << r.output;
}

TEST(Cli, BenchListNamesEveryCase) {
  const RunResult r = run_cli("bench --list");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const bench::BenchCase& c : bench::bench_cases()) EXPECT_TRUE(has(r, c.name)) << c.name;
  EXPECT_TRUE(has(r, "gpu: ")) << r.output;
}

TEST(Cli, BenchCaseWithoutBackendSaysWhatItNeeds) {
  if (built_with_cuda() && cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  const RunResult r = run_cli("bench --case P32K-tok");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "P32K-tok: needs the CUDA sparse prefill")) << r.output;
  const RunResult d = run_cli("bench --case DEC-B32 --device cpu");
  EXPECT_EQ(d.code, 0) << d.output;
  EXPECT_TRUE(has(d, "prefill stages only")) << d.output;
}

// The GPU runner of `msa bench` times the named prefill shapes only: with a shape option the
// case names that reason (CUDA builds) or the missing backend (CPU builds), never a silent
// switch to another shape.
TEST(Cli, BenchGpuRunnerRefusesShapeOverrides) {
  const RunResult r = run_cli("bench --case P8K-tok --seq 4096 --device gpu");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, built_with_cuda() ? "drop the shape options" : "no CUDA backend")) << r.output;
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
  const RunResult dense = run_cli("bench --device cpu --seq 256 --hq 4 --hkv 1 --topk 2 --blk 128 --iters 1");
  EXPECT_EQ(dense.code, 0) << dense.output;
  EXPECT_TRUE(has(dense, "warning: the selection is dense: it covers 100.0%")) << dense.output;
  EXPECT_TRUE(has(dense, "topK 2 >= 2 key blocks")) << dense.output;
  const RunResult sparse = run_cli("bench --device cpu --seq 1024 --hq 4 --hkv 1 --topk 2 --blk 128 --iters 1");
  EXPECT_EQ(sparse.code, 0) << sparse.output;
  EXPECT_FALSE(has(sparse, "the selection is dense")) << sparse.output;
}

TEST(Cli, HelpExitsZero) {
  for (const char* cmd : {"--help", "demo --help", "bench --help"}) {
    const RunResult r = run_cli(cmd);
    EXPECT_EQ(r.code, 0) << cmd << "\n" << r.output;
    EXPECT_TRUE(has(r, "usage: msa")) << cmd << "\n" << r.output;
  }
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
  };
  for (const auto& c : cases) {
    const RunResult r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(has(r, c.message)) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace msa::test
