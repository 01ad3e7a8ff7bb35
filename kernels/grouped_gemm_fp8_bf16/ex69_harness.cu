// casebook's harness for CUTLASS example 69 (Hopper fp8 e5m2 x bf16 grouped GEMM).
//
// Runs the example's own kernel types (GemmConvertOnly, GemmScaleOnly, compiled from the
// example's source in the pinned nvidia-cutlass wheel, included below with its `main`
// renamed) on a problem read from files, and writes D, so that the CuTe DSL port and the
// reference can be compared on identical inputs. Our code; the example is not modified.
//
// Built twice from one object: the executable ex69_harness, and libex69.so (the same
// launch on caller-owned device buffers and stream, for timing without files).
// Usage: ex69_harness --resources    (no GPU needed)
//        ex69_harness DIR [ITERATIONS]
//   DIR/problem.txt  "groups mode n k c alpha beta" then one M per group
//   DIR/a.bin        bf16, groups stacked along M: (sum M, K) row-major
//   DIR/b.bin        fp8 e5m2, (groups, N, K), K contiguous
//   DIR/scale.bin    bf16, (groups, ceil(K/c), N), N contiguous (ScaleOnly only)
//   DIR/c.bin        f16, (sum M, N) row-major
// Writes DIR/d.bin (f16, like c.bin); with ITERATIONS > 0 also prints
// "mean_ms <milliseconds per launch>" from CUDA events around ITERATIONS launches.
// --resources prints, per mode, the kernel's dynamic shared memory (its SharedStorage),
// threads per CTA and mainloop stages, which the cubin does not record.

#define main cutlass_example69_main
#include "69_hopper_mixed_dtype_grouped_gemm.cu"
#undef main

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#error "example 69 needs CUDA 12.3+ compiling for sm_90a"
#endif

namespace harness {

struct Problem {
  int groups = 0, mode = 0, n = 0, k = 0, c = 0;
  float alpha = 1.f, beta = 0.f;
  std::vector<int> m;
};

[[noreturn]] void fail(std::string const& what) {
  std::fprintf(stderr, "ex69_harness: %s\n", what.c_str());
  std::exit(2);
}

Problem read_problem(std::string const& dir) {
  std::ifstream in(dir + "/problem.txt");
  Problem p;
  if (!(in >> p.groups >> p.mode >> p.n >> p.k >> p.c >> p.alpha >> p.beta)) {
    fail(dir + "/problem.txt: expected 'groups mode n k c alpha beta'");
  }
  p.m.resize(p.groups);
  for (int& m : p.m) {
    if (!(in >> m)) fail(dir + "/problem.txt: expected one M per group");
  }
  return p;
}

template <class T>
std::vector<T> read_array(std::string const& path, size_t count) {
  std::vector<T> out(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(out.data()), count * sizeof(T));
  if (!in || in.peek() != EOF) fail(path + ": expected " + std::to_string(count * sizeof(T)) + " bytes");
  return out;
}

template <class T>
cutlass::DeviceAllocation<T> to_device(std::vector<T> const& host) {
  cutlass::DeviceAllocation<T> dev(host.size());
  dev.copy_from_host(host.data());
  return dev;
}

template <class T>
cutlass::DeviceAllocation<T const*> pointers(T const* base, std::vector<int64_t> const& offsets) {
  std::vector<T const*> host;
  for (int64_t off : offsets) host.push_back(base + off);
  return to_device(host);
}

[[noreturn]] void raise(std::string const& what) { throw std::runtime_error(what); }

void check(cutlass::Status status, char const* what) {
  if (status != cutlass::Status::kSuccess) {
    raise(std::string(what) + ": " + cutlassGetStatusString(status));
  }
}

// One mode's kernel bound to device buffers laid out as the files are; run() launches it.
struct Launch {
  virtual ~Launch() = default;
  virtual void run(cudaStream_t stream) = 0;
};

template <typename Gemm>
struct GemmLaunch : Launch {
  cutlass::DeviceAllocation<MmaType const*> ptr_a;
  cutlass::DeviceAllocation<QuantType const*> ptr_b;
  cutlass::DeviceAllocation<ElementScale const*> ptr_s;
  cutlass::DeviceAllocation<ElementC const*> ptr_c;
  cutlass::DeviceAllocation<ElementC*> ptr_d;
  cutlass::DeviceAllocation<typename ProblemShape::UnderlyingProblemShape> shapes;
  cutlass::DeviceAllocation<StrideA> sa;
  cutlass::DeviceAllocation<StrideB> sb;
  cutlass::DeviceAllocation<StrideC> sc;
  cutlass::DeviceAllocation<StrideD> sd;
  cutlass::DeviceAllocation<StrideS> ss;
  cutlass::device_memory::allocation<uint8_t> workspace;
  Gemm gemm;

  GemmLaunch(Problem const& p, MmaType const* a, QuantType const* b, ElementScale const* scale,
             ElementC const* c, ElementC* d) {
    int64_t const scale_k = cutlass::ceil_div(p.k, p.c);
    int64_t row = 0;
    std::vector<int64_t> off_a, off_b, off_s, off_c;
    std::vector<typename ProblemShape::UnderlyingProblemShape> host_shapes;
    std::vector<StrideA> host_sa;
    std::vector<StrideB> host_sb;
    std::vector<StrideC> host_sc;
    std::vector<StrideD> host_sd;
    std::vector<StrideS> host_ss;
    for (int g = 0; g < p.groups; ++g) {
      int const m = p.m[g];
      off_a.push_back(row * p.k);
      off_b.push_back(int64_t(g) * p.n * p.k);
      off_s.push_back(int64_t(g) * scale_k * p.n);
      off_c.push_back(row * p.n);
      row += m;
      // The example's kernel computes the transposed problem: (N, M, K) per group.
      host_shapes.push_back({p.n, m, p.k});
      host_sa.push_back(cutlass::make_cute_packed_stride(StrideA{}, {m, p.k, 1}));
      host_sb.push_back(cutlass::make_cute_packed_stride(StrideB{}, {p.n, p.k, 1}));
      host_sc.push_back(cutlass::make_cute_packed_stride(StrideC{}, {p.n, m, 1}));
      host_sd.push_back(cutlass::make_cute_packed_stride(StrideD{}, {p.n, m, 1}));
      host_ss.push_back(cutlass::make_cute_packed_stride(StrideS{}, {p.n, int(scale_k), 1}));
    }
    ptr_a = pointers(a, off_a);
    ptr_b = pointers(b, off_b);
    ptr_s = pointers(scale, off_s);
    ptr_c = pointers(c, off_c);
    std::vector<ElementC*> d_host;
    for (int64_t off : off_c) d_host.push_back(d + off);
    ptr_d = to_device(d_host);
    shapes = to_device(host_shapes);
    sa = to_device(host_sa);
    sb = to_device(host_sb);
    sc = to_device(host_sc);
    sd = to_device(host_sd);
    ss = to_device(host_ss);

    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = 0;
    hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
    typename Gemm::Arguments args;
    decltype(args.epilogue.thread) fusion;
    fusion.alpha = p.alpha;
    fusion.beta = p.beta;
    fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
    fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
    typename ProblemShape::UnderlyingProblemShape const* no_host_shapes = nullptr;
    if constexpr (Gemm::CollectiveMainloop::KernelConversionMode ==
                  Gemm::CollectiveMainloop::ConversionMode::DirectConvert) {
      args = typename Gemm::Arguments{
          cutlass::gemm::GemmUniversalMode::kGrouped,
          {p.groups, shapes.get(), no_host_shapes},
          {ptr_b.get(), sb.get(), ptr_a.get(), sa.get()},
          {fusion, ptr_c.get(), sc.get(), ptr_d.get(), sd.get()},
          hw_info};
    } else {
      args = typename Gemm::Arguments{
          cutlass::gemm::GemmUniversalMode::kGrouped,
          {p.groups, shapes.get(), no_host_shapes},
          {ptr_b.get(), sb.get(), ptr_a.get(), sa.get(), ptr_s.get(), ss.get(), p.c},
          {fusion, ptr_c.get(), sc.get(), ptr_d.get(), sd.get()},
          hw_info};
    }
    workspace.reset(Gemm::get_workspace_size(args));
    check(gemm.can_implement(args), "can_implement");
    check(gemm.initialize(args, workspace.get()), "initialize");
  }

  void run(cudaStream_t stream) override { check(gemm.run(stream), "run"); }
};

std::unique_ptr<Launch> make_launch(Problem const& p, void const* a, void const* b,
                                    void const* scale, void const* c, void* d) {
  auto const* a_ = static_cast<MmaType const*>(a);
  auto const* b_ = static_cast<QuantType const*>(b);
  auto const* s_ = static_cast<ElementScale const*>(scale);
  auto const* c_ = static_cast<ElementC const*>(c);
  auto* d_ = static_cast<ElementC*>(d);
  if (p.mode == 0) return std::make_unique<GemmLaunch<GemmConvertOnly>>(p, a_, b_, s_, c_, d_);
  if (p.mode == 1) return std::make_unique<GemmLaunch<GemmScaleOnly>>(p, a_, b_, s_, c_, d_);
  raise("mode must be 0 (ConvertOnly) or 1 (ScaleOnly)");
}

// The executable's path: inputs from files, D to a file.
int run_files(Problem const& p, std::string const& dir, int iterations) {
  int64_t const total_m = std::accumulate(p.m.begin(), p.m.end(), int64_t(0));
  int64_t const scale_k = cutlass::ceil_div(p.k, p.c);
  auto a = to_device(read_array<MmaType>(dir + "/a.bin", total_m * p.k));
  auto b = to_device(read_array<QuantType>(dir + "/b.bin", size_t(p.groups) * p.n * p.k));
  auto c = to_device(read_array<ElementC>(dir + "/c.bin", total_m * p.n));
  std::vector<ElementScale> scale_host(size_t(p.groups) * scale_k * p.n, ElementScale(1.f));
  if (p.mode == 1) scale_host = read_array<ElementScale>(dir + "/scale.bin", scale_host.size());
  auto scale = to_device(scale_host);
  cutlass::DeviceAllocation<ElementC> d(total_m * p.n);
  auto launch = make_launch(p, a.get(), b.get(), scale.get(), c.get(), d.get());
  launch->run(nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<ElementC> out(total_m * p.n);
  d.copy_to_host(out.data());
  std::ofstream(dir + "/d.bin", std::ios::binary)
      .write(reinterpret_cast<char const*>(out.data()), out.size() * sizeof(ElementC));
  if (iterations > 0) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < iterations; ++i) launch->run(nullptr);
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("mean_ms %.6f\n", ms / iterations);
  }
  return 0;
}

template <typename Gemm>
void print_resources(char const* mode) {
  using Kernel = typename Gemm::GemmKernel;
  std::printf("%s dynamic_smem_bytes %d threads %d stages %d\n", mode,
              int(Kernel::SharedStorageSize), int(Kernel::MaxThreadsPerBlock),
              int(Kernel::CollectiveMainloop::DispatchPolicy::Stages));
}

}  // namespace harness

// The library's path (libex69.so, loaded by kernels/grouped_gemm_fp8_bf16/device.py):
// the same launch on device buffers the caller owns, run on the caller's stream. Errors
// come back as a null handle or non-zero status, with the message from ex69_last_error.
namespace {
std::string last_error;
}

extern "C" {

char const* ex69_last_error() { return last_error.c_str(); }

void* ex69_create(int groups, int mode, int n, int k, int c, float alpha, float beta,
                  int const* m, void const* a, void const* b, void const* scale,
                  void const* c_in, void* d) {
  try {
    harness::Problem const p{groups, mode, n, k, c, alpha, beta, std::vector<int>(m, m + groups)};
    return harness::make_launch(p, a, b, scale, c_in, d).release();
  } catch (std::exception const& error) {
    last_error = error.what();
    return nullptr;
  }
}

int ex69_run(void* launch, void* stream) {
  try {
    static_cast<harness::Launch*>(launch)->run(static_cast<cudaStream_t>(stream));
    return 0;
  } catch (std::exception const& error) {
    last_error = error.what();
    return 1;
  }
}

void ex69_destroy(void* launch) { delete static_cast<harness::Launch*>(launch); }

}  // extern "C"

int main(int argc, char const** argv) {
  if (argc < 2) harness::fail("usage: ex69_harness --resources | DIR [ITERATIONS]");
  std::string const dir = argv[1];
  if (dir == "--resources") {
    harness::print_resources<GemmConvertOnly>("convert_only");
    harness::print_resources<GemmScaleOnly>("scale_only");
    return 0;
  }
  try {
    return harness::run_files(harness::read_problem(dir), dir, argc > 2 ? std::atoi(argv[2]) : 0);
  } catch (std::exception const& error) {
    harness::fail(error.what());
  }
}
