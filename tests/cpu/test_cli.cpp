// The `msa` command-line tool, run as a subprocess: demo on small CPU shapes passes its own
// check, bench lists every bench/CASES.md case and times custom CPU shapes, bad options exit 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "bench/cases.h"
#include "msa/version.h"

namespace msa::test {
namespace {

struct RunResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

RunResult run_cli(const std::string& args) {
  const std::string cmd = std::string(MSA_CLI_PATH) + " " + args + " 2>&1";
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

TEST(Cli, BenchTimesCustomCpuShapeAndWritesJson) {
  const std::string path = ::testing::TempDir() + "msa_cli_bench.json";
  const RunResult r = run_cli("bench --device cpu --seq 256 --hq 4 --hkv 1 --topk 2 --pattern blk "
                              "--iters 2 --json " + path);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "attention_forward")) << r.output;
  std::ifstream f(path);
  std::stringstream json;
  json << f.rdbuf();
  EXPECT_TRUE(json.str().find("\"status\":\"ok\"") != std::string::npos) << json.str();
  EXPECT_TRUE(json.str().find("\"pattern\":\"blk\"") != std::string::npos) << json.str();
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
