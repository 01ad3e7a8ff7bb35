// casebook's harness for CUTLASS example 69 (Hopper fp8 e5m2 x bf16 grouped GEMM).
//
// Runs the example's own kernel types (GemmConvertOnly, GemmScaleOnly, compiled from the
// example's source in the pinned nvidia-cutlass wheel, included below with its `main`
// renamed) on a problem read from files, and writes D, so that the CuTe DSL port and the
// reference can be compared on identical inputs. Our code; the example is not modified.
//
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

template <typename Gemm>
int run(Problem const& p, std::string const& dir, int iterations) {
  int64_t const scale_k = cutlass::ceil_div(p.k, p.c);
  int64_t total_m = 0;
  std::vector<int64_t> off_a, off_b, off_s, off_c;
  std::vector<typename ProblemShape::UnderlyingProblemShape> shapes;
  std::vector<StrideA> sa;
  std::vector<StrideB> sb;
  std::vector<StrideC> sc;
  std::vector<StrideD> sd;
  std::vector<StrideS> ss;
  for (int g = 0; g < p.groups; ++g) {
    int const m = p.m[g];
    off_a.push_back(total_m * p.k);
    off_b.push_back(int64_t(g) * p.n * p.k);
    off_s.push_back(int64_t(g) * scale_k * p.n);
    off_c.push_back(total_m * p.n);
    total_m += m;
    // The example's kernel computes the transposed problem: (N, M, K) per group.
    shapes.push_back({p.n, m, p.k});
    sa.push_back(cutlass::make_cute_packed_stride(StrideA{}, {m, p.k, 1}));
    sb.push_back(cutlass::make_cute_packed_stride(StrideB{}, {p.n, p.k, 1}));
    sc.push_back(cutlass::make_cute_packed_stride(StrideC{}, {p.n, m, 1}));
    sd.push_back(cutlass::make_cute_packed_stride(StrideD{}, {p.n, m, 1}));
    ss.push_back(cutlass::make_cute_packed_stride(StrideS{}, {p.n, int(scale_k), 1}));
  }
  auto a = to_device(read_array<MmaType>(dir + "/a.bin", total_m * p.k));
  auto b = to_device(read_array<QuantType>(dir + "/b.bin", size_t(p.groups) * p.n * p.k));
  auto c = to_device(read_array<ElementC>(dir + "/c.bin", total_m * p.n));
  std::vector<ElementScale> scale_host(size_t(p.groups) * scale_k * p.n, ElementScale(1.f));
  if (p.mode == 1) scale_host = read_array<ElementScale>(dir + "/scale.bin", scale_host.size());
  auto scale = to_device(scale_host);
  cutlass::DeviceAllocation<ElementC> d(total_m * p.n);
  auto ptr_a = pointers(a.get(), off_a);
  auto ptr_b = pointers(b.get(), off_b);
  auto ptr_s = pointers(scale.get(), off_s);
  auto ptr_c = pointers(c.get(), off_c);
  std::vector<ElementC*> d_host;
  for (int64_t off : off_c) d_host.push_back(d.get() + off);
  auto ptr_d = to_device(d_host);
  auto dev_shapes = to_device(shapes);
  auto dev_sa = to_device(sa);
  auto dev_sb = to_device(sb);
  auto dev_sc = to_device(sc);
  auto dev_sd = to_device(sd);
  auto dev_ss = to_device(ss);

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
        {p.groups, dev_shapes.get(), no_host_shapes},
        {ptr_b.get(), dev_sb.get(), ptr_a.get(), dev_sa.get()},
        {fusion, ptr_c.get(), dev_sc.get(), ptr_d.get(), dev_sd.get()},
        hw_info};
  } else {
    args = typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {p.groups, dev_shapes.get(), no_host_shapes},
        {ptr_b.get(), dev_sb.get(), ptr_a.get(), dev_sa.get(), ptr_s.get(), dev_ss.get(), p.c},
        {fusion, ptr_c.get(), dev_sc.get(), ptr_d.get(), dev_sd.get()},
        hw_info};
  }
  Gemm gemm;
  cutlass::device_memory::allocation<uint8_t> workspace(Gemm::get_workspace_size(args));
  CUTLASS_CHECK(gemm.can_implement(args));
  CUTLASS_CHECK(gemm.initialize(args, workspace.get()));
  CUTLASS_CHECK(gemm.run());
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
    for (int i = 0; i < iterations; ++i) CUTLASS_CHECK(gemm.run());
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

int main(int argc, char const** argv) {
  if (argc < 2) harness::fail("usage: ex69_harness --resources | DIR [ITERATIONS]");
  std::string const dir = argv[1];
  if (dir == "--resources") {
    harness::print_resources<GemmConvertOnly>("convert_only");
    harness::print_resources<GemmScaleOnly>("scale_only");
    return 0;
  }
  int const iterations = argc > 2 ? std::atoi(argv[2]) : 0;
  harness::Problem const p = harness::read_problem(dir);
  if (p.mode == 0) return harness::run<GemmConvertOnly>(p, dir, iterations);
  if (p.mode == 1) return harness::run<GemmScaleOnly>(p, dir, iterations);
  harness::fail("mode must be 0 (ConvertOnly) or 1 (ScaleOnly)");
}
