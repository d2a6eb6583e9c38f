"""Mixture-of-experts layers: top-k routing (`routing`) and the expert computation, as a torch reference
(`torch_moe`, any device) and as fused Triton kernels on CUDA (`triton_moe`, over the sort of `align`)."""
