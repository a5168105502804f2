# Source on the GPU machine before starting SGLang from /tmp/sglsite (its own folder before the vLLM kit's).
# its .pth folders too (pip --target makes no site directory): CUTLASS's DSL lives in one
export PYTHONPATH=/tmp/sglsite:/tmp/sglsite/nvidia_cutlass_dsl/python_packages:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1
export SGLANG_USE_SGL_FA3_KERNEL=1   # (default) FA3 from sgl-kernel, not the HF "kernels" hub (network)
