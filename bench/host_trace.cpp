// libmsa_host_trace.so: where a program's host time goes in the CUDA runtime and driver. Loaded
// with LD_PRELOAD, it times every runtime and driver API call through CUPTI callbacks (a call's
// own time, the driver calls it makes excluded) and prints, at exit, each function's count and
// host microseconds, most first. Used on bench_latency to split a call's host time into its CUDA
// calls and msa's own work:
//   LD_PRELOAD=build/bench/libmsa_host_trace.so build/bench/bench_latency --case LAT-256 --host-only
// Each callback adds well under a microsecond; compare counts and shares, not absolute figures.
#include <cupti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Totals {
  long long calls = 0;
  double self_us = 0;  // excluding the traced calls made inside this one
};

struct Tracer {
  std::mutex mu;
  std::map<std::string, Totals> by_name;
  CUpti_SubscriberHandle subscriber{};
};
Tracer* tracer = nullptr;

// The calls in flight on this thread (a runtime call's driver calls nest inside it).
struct Frame {
  Clock::time_point start;
  double child_us = 0;
};
thread_local std::vector<Frame> stack;

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite == CUPTI_API_ENTER) {
    stack.push_back({Clock::now(), 0});
    return;
  }
  if (stack.empty()) return;
  const Frame f = stack.back();
  stack.pop_back();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - f.start).count();
  if (!stack.empty()) stack.back().child_us += us;
  std::string name = std::string(domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "rt " : "drv ") +
                     (info->functionName ? info->functionName : "?");
  if (info->symbolName != nullptr) {  // a launch: which kernel (its mangled name, cut short)
    std::string sym(info->symbolName);
    if (sym.size() > 40) sym = sym.substr(0, 40);
    name += " " + sym;
  }
  std::lock_guard<std::mutex> lock(tracer->mu);
  Totals& t = tracer->by_name[name];
  ++t.calls;
  t.self_us += us - f.child_us;
}

__attribute__((constructor)) void start() {
  tracer = new Tracer();
  if (cuptiSubscribe(&tracer->subscriber, on_api, nullptr) != CUPTI_SUCCESS ||
      cuptiEnableDomain(1, tracer->subscriber, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS ||
      cuptiEnableDomain(1, tracer->subscriber, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS)
    std::fprintf(stderr, "host_trace: CUPTI subscription failed; nothing traced\n");
}

__attribute__((destructor)) void report() {
  cuptiUnsubscribe(tracer->subscriber);
  std::vector<std::pair<std::string, Totals>> rows(tracer->by_name.begin(), tracer->by_name.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
  std::fprintf(stderr, "\nhost_trace: CUDA API calls by host time (self, microseconds)\n");
  std::fprintf(stderr, "%-90s %10s %12s %9s\n", "function", "calls", "total us", "us/call");
  for (const auto& [name, t] : rows)
    std::fprintf(stderr, "%-90s %10lld %12.1f %9.3f\n", name.c_str(), t.calls, t.self_us,
                 t.self_us / double(t.calls));
}

}  // namespace
