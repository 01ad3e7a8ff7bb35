"""One package per case study; each defines the functions kernels.contract lists."""
