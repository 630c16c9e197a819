"""One module per training method, each a small class over shared kernels."""
