"""A synthetic upstream for hermetic build tests.

Two local git repositories with the layout and file naming of the pinned
upstream (vllm-project/flash-attention: FA2 in csrc/flash_attn, FA3 in hopper/;
NVIDIA/cutlass: include/), but tiny kernels: every instantiation file defines
the same symbols upstream's does, each backed by a one-line CUDA kernel, and
the dispatchers reference those symbols under the same FLASHATTENTION_* switches.
So a build whose file list and defines disagree fails exactly like the real one
would (an undefined symbol at import), in seconds instead of an hour.

The op registrations use the torch stable ABI like upstream, so the modules
load with `import torch` first on a machine without a GPU. Each registration source
defines the ops this package calls with their schemas (op_schemas.py) in upstream's own
layout (FA2: a few arguments per string literal; FA3: one padded argument per literal, a
comment between two), which the configure's schema check (cmake/vfa_build/knobs/op_schemas.py) reads; the
tiny kernels are reached through ops of their own (tiny_varlen_fwd, tiny_fwd).
"""

from __future__ import annotations

# One file over 500 lines, on purpose: one fake upstream whose source templates must stay beside
# the layout that names them.

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vendored_flash_attn.declaration import knob_values as declared

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cmake"))  # the build's package (also outside pytest)
from vfa_build.sources import source_anchor  # noqa: E402  (the pin's anchor: written for every synthetic pin)

# The head dims upstream instantiates, as the project declares them (cmake/knobs.json).
FA2_HEAD_DIMS = declared.FA2_HEAD_DIMS
FA2_DTYPES = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t"}
FA3_HEAD_DIMS = declared.FA3_HEAD_DIMS
FA3_DTYPES = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t", "e4m3": "cutlass::float_e4m3_t"}
# variant suffix -> (Split, PagedKVNonTMA, Has_softcap, PackGQA), as upstream's generate_kernels.py
FA3_VARIANTS = {
    "": (False, False, False, False),
    "softcap": (False, False, True, False),
    "packgqa": (False, False, False, True),
    "softcap_packgqa": (False, False, True, True),
    "split": (True, False, False, True),
    "split_softcap": (True, False, True, True),
    "paged": (False, True, False, True),
    "paged_softcap": (False, True, True, True),
    "paged_split": (True, True, False, True),
    "paged_split_softcap": (True, True, True, True),
}
FA3_HDIMDIFF = {"64_256": (64, 256, ("bf16", "fp16")), "64_512": (64, 512, ("bf16", "fp16")),
                "192_128": (192, 128, ("bf16", "fp16", "e4m3"))}

REGISTRATION_H = r"""#pragma once
#include <Python.h>
#define _CONCAT(A, B) A##B
#define CONCAT(A, B) _CONCAT(A, B)
#define _STRINGIFY(A) #A
#define STRINGIFY(A) _STRINGIFY(A)
#define STABLE_TORCH_LIBRARY_EXPAND(NAME, MODULE) STABLE_TORCH_LIBRARY(NAME, MODULE)
#define STABLE_TORCH_LIBRARY_IMPL_EXPAND(NAME, KEY, MODULE) STABLE_TORCH_LIBRARY_IMPL(NAME, KEY, MODULE)
#define REGISTER_EXTENSION(NAME)                                               \
  PyMODINIT_FUNC CONCAT(PyInit_, NAME)() {                                     \
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,                 \
                                        STRINGIFY(NAME), nullptr, 0, nullptr}; \
    return PyModule_Create(&module);                                           \
  }
"""

NAMESPACE_CONFIG_H = """#pragma once
#ifndef FLASH_NAMESPACE
#define FLASH_NAMESPACE flash
#endif
"""

FA2_FLASH_H = """#pragma once
#include "namespace_config.h"
#include <cuda.h>
#include <cuda_runtime.h>
namespace FLASH_NAMESPACE {
struct Flash_fwd_params { int d; bool is_bf16; bool is_causal; int num_splits; float *out; };
template<typename T, int Headdim, bool Is_causal> void run_mha_fwd_(Flash_fwd_params &params, cudaStream_t stream);
template<typename T, int Headdim, bool Is_causal> void run_mha_fwd_splitkv_dispatch(Flash_fwd_params &params, cudaStream_t stream);
}  // namespace FLASH_NAMESPACE
"""

FA2_FLASH_SPARSE_H = """#pragma once
#include "flash.h"
namespace FLASH_NAMESPACE {
struct Flash_fwd_params_sparse : public Flash_fwd_params { int nnz; };
template<typename T, int Headdim, bool Is_causal> void run_mha_fwd_sparse_(Flash_fwd_params_sparse &params, cudaStream_t stream);
}  // namespace FLASH_NAMESPACE
"""

FA2_STATIC_SWITCH_H = """#pragma once
#define BOOL_SWITCH(COND, CONST_NAME, ...) [&] { if (COND) { constexpr static bool CONST_NAME = true; return __VA_ARGS__(); } \\
  else { constexpr static bool CONST_NAME = false; return __VA_ARGS__(); } }()
#define FP16_SWITCH(COND, ...) [&] { if (COND) { using elem_type = cutlass::half_t; return __VA_ARGS__(); } \\
  else { using elem_type = cutlass::bfloat16_t; return __VA_ARGS__(); } }()
#define HEADDIM_SWITCH(HEADDIM, ...) [&] { \\
  if (HEADDIM <= 32) { constexpr static int kHeadDim = 32; return __VA_ARGS__(); } \\
  else if (HEADDIM <= 64) { constexpr static int kHeadDim = 64; return __VA_ARGS__(); } \\
  else if (HEADDIM <= 96) { constexpr static int kHeadDim = 96; return __VA_ARGS__(); } \\
  else if (HEADDIM <= 128) { constexpr static int kHeadDim = 128; return __VA_ARGS__(); } \\
  else if (HEADDIM <= 192) { constexpr static int kHeadDim = 192; return __VA_ARGS__(); } \\
  else { constexpr static int kHeadDim = 256; return __VA_ARGS__(); } }()
"""

# Upstream's CUDA units include torch's headers (FA2: cuda_check.h through the launch template;
# FA3: static_switch.h), so its device compiles read them as its C++ units do, and the compiler
# cache keys on the path they were read from (tests/dist/test_sdist.py, isolated builds). Here a
# light one of torch's (upstream's pull in more, at seconds of nvcc time per unit): its path is
# what matters.
FA2_CUDA_CHECK_H = """#pragma once
#include <cuda_runtime.h>
#include <torch/headeronly/macros/Macros.h>
"""

FA2_LAUNCH_TEMPLATE_H = """#pragma once
#include <cutlass/numeric_types.h>
#include "cuda_check.h"
#include "flash.h"
namespace FLASH_NAMESPACE {
template<int Headdim, bool Is_causal, int Kind>
__global__ void tiny_fwd_kernel(float *out) { if (out) { out[threadIdx.x] = float(Headdim * 4 + Is_causal * 2 + Kind); } }
template<typename T, int Headdim, bool Is_causal>
void run_mha_fwd_hdim(Flash_fwd_params &params, cudaStream_t stream) {
    tiny_fwd_kernel<Headdim, Is_causal, 0><<<1, 32, 0, stream>>>(params.out);
}
template<typename T, int Headdim, bool Is_causal>
void run_mha_fwd_splitkv_align(Flash_fwd_params &params, cudaStream_t stream) {
    tiny_fwd_kernel<Headdim, Is_causal, 1><<<1, 32, 0, stream>>>(params.out);
}
template<typename T, int Headdim, bool Is_causal>
void run_mha_fwd_splitkv_dispatch(Flash_fwd_params &params, cudaStream_t stream) {
    run_mha_fwd_splitkv_align<T, Headdim, Is_causal>(params, stream);
}
}  // namespace FLASH_NAMESPACE
"""

FA2_SPARSE_LAUNCH_TEMPLATE_H = """#pragma once
#include "flash_fwd_launch_template.h"
#include "flash_sparse.h"
"""

FA2_FLASH_API_CPP = """#include <cutlass/numeric_types.h>
#include "namespace_config.h"
#include "flash.h"
#include "static_switch.h"
namespace FLASH_NAMESPACE {
void run_mha_fwd(Flash_fwd_params &params, cudaStream_t stream, bool force_split_kernel) {
    FP16_SWITCH(!params.is_bf16, [&] {
        HEADDIM_SWITCH(params.d, [&] {
            BOOL_SWITCH(params.is_causal, Is_causal, [&] {
                if (params.num_splits <= 1 && !force_split_kernel) {
                    run_mha_fwd_<elem_type, kHeadDim, Is_causal>(params, stream);
                } else {
                    run_mha_fwd_splitkv_dispatch<elem_type, kHeadDim, Is_causal>(params, stream);
                }
            });
        });
    });
}
}  // namespace FLASH_NAMESPACE
"""

FA2_FLASH_API_SPARSE_CPP = """#include <cutlass/numeric_types.h>
#include "namespace_config.h"
#include "flash_sparse.h"
#include "static_switch.h"
namespace FLASH_NAMESPACE {
void run_mha_fwd_sparse(Flash_fwd_params_sparse &params, cudaStream_t stream) {
    FP16_SWITCH(!params.is_bf16, [&] {
        constexpr static int kHeadDim = 128;
        BOOL_SWITCH(params.is_causal, Is_causal, [&] {
            run_mha_fwd_sparse_<elem_type, kHeadDim, Is_causal>(params, stream);
        });
    });
}
}  // namespace FLASH_NAMESPACE
"""

FA2_TORCH_LIB_CPP = """#include "namespace_config.h"
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include "registration.h"
#include "flash_sparse.h"
using torch::stable::Tensor;
namespace FLASH_NAMESPACE {
void run_mha_fwd(Flash_fwd_params &params, cudaStream_t stream, bool force_split_kernel);
void run_mha_fwd_sparse(Flash_fwd_params_sparse &params, cudaStream_t stream);
Tensor varlen_fwd(Tensor q, int64_t head_dim, bool is_bf16, bool is_causal, int64_t num_splits, bool sparse) {
    Flash_fwd_params_sparse params{};
    params.d = static_cast<int>(head_dim);
    params.is_bf16 = is_bf16;
    params.is_causal = is_causal;
    params.num_splits = static_cast<int>(num_splits);
    params.out = static_cast<float *>(q.data_ptr());
    if (sparse) { run_mha_fwd_sparse(params, nullptr); } else { run_mha_fwd(params, nullptr, false); }
    return q;
}
}  // namespace FLASH_NAMESPACE
STABLE_TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
@REAL_OP_DEFS@
    ops.def("tiny_varlen_fwd(Tensor! q, int head_dim, bool is_bf16, bool is_causal, int num_splits, bool sparse) -> Tensor");
}
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {
    ops.impl("tiny_varlen_fwd", TORCH_BOX(&FLASH_NAMESPACE::varlen_fwd));
}
REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
"""

FA3_FLASH_H = """#pragma once
#include <cuda_runtime.h>
struct Flash_fwd_params { int d; int dv; bool is_bf16; bool is_e4m3; int num_splits; bool paged; float softcap; bool pack_gqa; float *out; };
template <int Arch, typename T, int kHeadDim, int kHeadDimV, bool Split, bool PagedKVNonTMA, bool Has_softcap, bool PackGQA>
void run_mha_fwd_(Flash_fwd_params &params, cudaStream_t stream);
template <typename T, typename Tpartial, int kBlockK>
void run_mha_fwd_combine_(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl);
void prepare_varlen_num_blocks(Flash_fwd_params &params, cudaStream_t stream, bool packgqa, int blockM, int blockN, bool enable_pdl);
"""

FA3_LAUNCH_TEMPLATE_H = """#pragma once
#include <cutlass/numeric_types.h>
#include "static_switch.h"
#include "flash.h"
template <int kHeadDim, int kHeadDimV, int Flags>
__global__ void tiny_fa3_kernel(float *out) { if (out) { out[threadIdx.x] = float(kHeadDim + kHeadDimV + Flags); } }
template <int Arch, typename T, int kHeadDim, int kHeadDimV, bool Split, bool PagedKVNonTMA, bool Has_softcap, bool PackGQA>
void run_mha_fwd_(Flash_fwd_params &params, cudaStream_t stream) {
    static_assert(Arch == 90, "sm90 only");
    tiny_fa3_kernel<kHeadDim, kHeadDimV, Split * 8 + PagedKVNonTMA * 4 + Has_softcap * 2 + PackGQA><<<1, 32, 0, stream>>>(params.out);
}
"""

FA3_STATIC_SWITCH_H = """#pragma once
#include <torch/headeronly/macros/Macros.h>
#define BOOL_SWITCH(COND, CONST_NAME, ...) [&] { if (COND) { constexpr static bool CONST_NAME = true; return __VA_ARGS__(); } \\
  else { constexpr static bool CONST_NAME = false; return __VA_ARGS__(); } }()
#define FALSE_SWITCH(COND, CONST_NAME, ...) [&] { constexpr static bool CONST_NAME = false; return __VA_ARGS__(); }()
#ifdef FLASHATTENTION_DISABLE_SOFTCAP
  #define SOFTCAP_SWITCH FALSE_SWITCH
#else
  #define SOFTCAP_SWITCH BOOL_SWITCH
#endif
#ifdef FLASHATTENTION_DISABLE_PAGEDKV
  #define PAGEDKV_SWITCH FALSE_SWITCH
#else
  #define PAGEDKV_SWITCH BOOL_SWITCH
#endif
#ifdef FLASHATTENTION_DISABLE_SPLIT
  #define SPLIT_SWITCH FALSE_SWITCH
#else
  #define SPLIT_SWITCH BOOL_SWITCH
#endif
#define PACKGQA_SWITCH BOOL_SWITCH
"""

FA3_COMBINE_CU = """#include <cutlass/numeric_types.h>
#include "flash.h"
template <int kBlockK> __global__ void tiny_combine_kernel(float *out) { if (out) { out[threadIdx.x] = float(kBlockK); } }
template <typename T, typename Tpartial, int kBlockK>
void run_mha_fwd_combine_(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl) {
    tiny_combine_kernel<kBlockK><<<1, 32, 0, stream>>>(params.out);
}
template void run_mha_fwd_combine_<float, float, 64>(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl);
template void run_mha_fwd_combine_<float, float, 128>(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl);
template void run_mha_fwd_combine_<cutlass::half_t, float, 64>(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl);
template void run_mha_fwd_combine_<cutlass::half_t, float, 128>(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl);
template void run_mha_fwd_combine_<cutlass::bfloat16_t, float, 64>(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl);
template void run_mha_fwd_combine_<cutlass::bfloat16_t, float, 128>(Flash_fwd_params &params, cudaStream_t stream, bool enable_pdl);
"""

FA3_PREPARE_SCHEDULER_CU = """#include "flash.h"
__global__ void tiny_prepare_kernel(float *out) { if (out) { out[threadIdx.x] = 1.0f; } }
void prepare_varlen_num_blocks(Flash_fwd_params &params, cudaStream_t stream, bool packgqa, int blockM, int blockN, bool enable_pdl) {
    tiny_prepare_kernel<<<1, 32, 0, stream>>>(params.out);
}
"""

FA3_TORCH_LIB_CPP = """#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include "registration.h"
#include "flash.h"
using torch::stable::Tensor;
void run_mha_fwd(Flash_fwd_params &params, cudaStream_t stream);
Tensor fwd(Tensor q, int64_t head_dim, int64_t head_dim_v, int64_t dtype, bool paged, int64_t num_splits, double softcap) {
    Flash_fwd_params params{};
    params.d = static_cast<int>(head_dim);
    params.dv = static_cast<int>(head_dim_v);
    params.is_bf16 = dtype == 0;
    params.is_e4m3 = dtype == 2;
    params.paged = paged;
    params.num_splits = static_cast<int>(num_splits);
    params.softcap = static_cast<float>(softcap);
    params.out = static_cast<float *>(q.data_ptr());
    run_mha_fwd(params, nullptr);
    return q;
}
STABLE_TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
@REAL_OP_DEFS@
    ops.def("tiny_fwd(Tensor! q, int head_dim, int head_dim_v, int dtype, bool paged, int num_splits, float softcap) -> Tensor");
}
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {
    ops.impl("tiny_fwd", TORCH_BOX(&fwd));
}
REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
"""

CUTLASS_NUMERIC_TYPES_H = """#pragma once
#include <cstdint>
namespace cutlass {
struct bfloat16_t { uint16_t storage; };
struct half_t { uint16_t storage; };
struct float_e4m3_t { uint8_t storage; };
}  // namespace cutlass
"""


def _fa2_instantiations() -> dict[str, str]:
    files: dict[str, str] = {}
    head = '#include "namespace_config.h"\n#include "flash_fwd_launch_template.h"\n\nnamespace FLASH_NAMESPACE {\n\n'
    for hdim in FA2_HEAD_DIMS:
        for dtype, ctype in FA2_DTYPES.items():
            for causal in (False, True):
                c = "true" if causal else "false"
                suffix = "_causal" if causal else ""
                args = f"{ctype}, {hdim}, {c}"
                sig = "(Flash_fwd_params &params, cudaStream_t stream)"
                files[f"flash_fwd_hdim{hdim}_{dtype}{suffix}_sm80.cu"] = (
                    f"{head}template<>\nvoid run_mha_fwd_<{args}>{sig} {{\n"
                    f"    run_mha_fwd_hdim<{args}>(params, stream);\n}}\n\n}} // namespace FLASH_NAMESPACE\n")
                files[f"flash_fwd_split_hdim{hdim}_{dtype}{suffix}_sm80.cu"] = (
                    f"{head}extern template void run_mha_fwd_splitkv_align<{args}>{sig};\n\n"
                    f"template void run_mha_fwd_splitkv_dispatch<{args}>{sig};\n\n}} // namespace FLASH_NAMESPACE\n")
                files[f"flash_fwd_split_align_hdim{hdim}_{dtype}{suffix}_sm80.cu"] = (
                    f"{head}template void run_mha_fwd_splitkv_align<{args}>{sig};\n\n}} // namespace FLASH_NAMESPACE\n")
                if hdim == 128:
                    sparse_head = head.replace("flash_fwd_launch_template.h", "flash_fwd_sparse_launch_template.h")
                    files[f"flash_fwd_sparse_hdim{hdim}_{dtype}{suffix}_sm80.cu"] = (
                        f"{sparse_head}template<>\nvoid run_mha_fwd_sparse_<{args}>"
                        "(Flash_fwd_params_sparse &params, cudaStream_t stream) {\n"
                        f"    run_mha_fwd_hdim<{args}>(params, stream);\n}}\n\n}} // namespace FLASH_NAMESPACE\n")
    return files


def _fa3_instantiation(name: str, dtype: str, hdim: int, hdimv: int, variant: str) -> tuple[str, str]:
    split, paged, softcap, packgqa = (str(b).lower() for b in FA3_VARIANTS[variant])
    tail = f"_{variant}" if variant else ""
    filename = f"flash_fwd_hdim{name}_{dtype}{tail}_sm90.cu"
    text = (
        '#include "flash_fwd_launch_template.h"\n\n'
        f"#ifndef FLASHATTENTION_DISABLE_HDIM{hdim}\n"
        f"template void run_mha_fwd_<90, {FA3_DTYPES[dtype]}, {hdim}, {hdimv}, {split}, {paged}, {softcap}, {packgqa}>"
        "(Flash_fwd_params &params, cudaStream_t stream);\n#endif\n")
    return filename, text


def _fa3_instantiations() -> dict[str, str]:
    files: dict[str, str] = {}
    for dtype in FA3_DTYPES:
        for hdim in FA3_HEAD_DIMS:
            for variant in FA3_VARIANTS:
                name, text = _fa3_instantiation(str(hdim), dtype, hdim, hdim, variant)
                files[name] = text
    for name, (hdim, hdimv, dtypes) in FA3_HDIMDIFF.items():
        for dtype in dtypes:
            for variant in FA3_VARIANTS:
                fname, text = _fa3_instantiation(name, dtype, hdim, hdimv, variant)
                files[fname] = text
    return files


def _fa3_dispatch_block(ctype: str, fp8: bool) -> str:
    """The per-dtype head-dim dispatch, with upstream's #ifndef switches."""
    call = lambda h, hv, pack: (  # noqa: E731
        f"return run_mha_fwd_<90, {ctype}, {h}, {hv}, Split, PagedKVNonTMA, Has_softcap, {pack}>(params, stream);")
    lines = ["#ifndef FLASHATTENTION_DISABLE_HDIM64", "if (params.d <= 64) {"]
    if not fp8:
        lines += ["#ifndef FLASHATTENTION_DISABLE_HDIMDIFF64",
                  f"if (params.dv > 256) {{ {call(64, 512, 'PackGQA_HDIMDIFF')} }}",
                  f"if (params.dv > 64) {{ {call(64, 256, 'PackGQA_HDIMDIFF')} }}",
                  "#endif"]
    lines += [call(64, 64, "PackGQA"), "}", "#endif"]
    for h in (96, 128):
        lines += [f"#ifndef FLASHATTENTION_DISABLE_HDIM{h}", f"if (params.d <= {h}) {{ {call(h, h, 'PackGQA')} }}", "#endif"]
    lines += ["#ifndef FLASHATTENTION_DISABLE_HDIM192", "if (params.d <= 192) {",
              "#ifndef FLASHATTENTION_DISABLE_HDIMDIFF192",
              f"if (params.dv <= 128) {{ {call(192, 128, 'PackGQA_HDIMDIFF')} }}",
              "#endif", call(192, 192, "PackGQA"), "}", "#endif",
              "#ifndef FLASHATTENTION_DISABLE_HDIM256", f"if (params.d <= 256) {{ {call(256, 256, 'PackGQA')} }}", "#endif"]
    return "\n".join(lines)


def _fa3_flash_api_cpp() -> str:
    return f"""#include <cutlass/numeric_types.h>
#include <torch/headeronly/util/Exception.h>
#include "flash.h"
#include "static_switch.h"
void run_mha_fwd(Flash_fwd_params &params, cudaStream_t stream) {{
    SPLIT_SWITCH(params.num_splits > 1, Split, [&] {{
        PAGEDKV_SWITCH(params.paged, PagedKVNonTMA, [&] {{
            PACKGQA_SWITCH(params.pack_gqa, PackGQA_, [&] {{
                #ifdef FLASHATTENTION_PACKGQA_ONLY
                static constexpr bool PackGQA = true;
                #else
                static constexpr bool PackGQA = PackGQA_ || PagedKVNonTMA || Split;
                #endif
                static constexpr bool PackGQA_HDIMDIFF = PackGQA_ || PagedKVNonTMA || Split;
                SOFTCAP_SWITCH(params.softcap > 0.0, Has_softcap, [&] {{
                    if (!params.is_e4m3) {{
                        if (params.is_bf16) {{
{_fa3_dispatch_block("cutlass::bfloat16_t", fp8=False)}
                        }} else {{
                            #ifndef FLASHATTENTION_DISABLE_FP16
{_fa3_dispatch_block("cutlass::half_t", fp8=False)}
                            #else
                            STD_TORCH_CHECK(false, "This flash attention build does not support FP16.");
                            #endif
                        }}
                    }} else {{
                        #ifndef FLASHATTENTION_DISABLE_FP8
{_fa3_dispatch_block("cutlass::float_e4m3_t", fp8=True)}
                        #else
                        STD_TORCH_CHECK(false, "This flash attention build does not support FP8.");
                        #endif
                    }}
                }});
            }});
        }});
    }});
    #ifndef FLASHATTENTION_DISABLE_SPLIT
    if (params.num_splits > 1) {{
        if (params.is_bf16) {{ run_mha_fwd_combine_<cutlass::bfloat16_t, float, 128>(params, stream, false); }}
        else {{ run_mha_fwd_combine_<cutlass::half_t, float, 64>(params, stream, false); }}
        run_mha_fwd_combine_<float, float, 64>(params, stream, false);
    }}
    #endif
    prepare_varlen_num_blocks(params, stream, true, 128, 128, false);
}}
"""


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "synthetic", "GIT_AUTHOR_EMAIL": "synthetic@example.invalid",
           "GIT_COMMITTER_NAME": "synthetic", "GIT_COMMITTER_EMAIL": "synthetic@example.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
           "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(cwd)}
    out = subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def _side_commit(repo: Path, message: str) -> str:
    """A new commit (same tree, HEAD as parent) on a branch of its own."""
    sha = _git(repo, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", message)
    _git(repo, "update-ref", f"refs/heads/side-{sha[:12]}", sha)
    return sha


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _fa2_style_def(schema: str) -> str:
    """``ops.def`` as upstream's csrc/flash_attn/flash_api_torch_lib.cpp writes it: a few
    arguments per string literal."""
    pieces = [piece + ", " for piece in schema.split(", ")]
    pieces[-1] = pieces[-1][:-2]
    lines, line = [], ""
    for piece in pieces:
        if line and len(line) + len(piece) > 90:
            lines.append(line)
            line = ""
        line += piece
    lines.append(line)
    return "    ops.def(" + "\n            ".join(f'"{text}"' for text in lines) + ");\n"


def _fa3_style_def(schema: str) -> str:
    """``ops.def`` as upstream's hopper/flash_api_torch_lib.cpp writes it: one argument per
    string literal, padded into columns, and a comment between two literals."""
    name, rest = schema.split("(", 1)
    arguments = [" ".join(a.split()) for a in rest.rsplit(")", 1)[0].split(",")]
    tail = ")" + rest.rsplit(")", 1)[1]
    padded = [f"{a.split(' ')[0]:<8} {a.split(' ')[1]}" for a in arguments]
    literals = [f"{name}({padded[0]},"] + [f"    {a}," for a in padded[1:]]
    literals[-1] = literals[-1][:-1] + tail
    body = "\n            ".join(f'"{text}"' for text in literals[:2])
    body += " // like upstream: a comment between the literals\n            "
    body += "\n            ".join(f'"{text}"' for text in literals[2:])
    return f"    ops.def({body});\n"


def _registrations(namespace: str, style) -> str:
    # Imported here: tests/conftest.py imports this module for every run, the GPU run too,
    # where the package comes from the installed wheel.
    from vendored_flash_attn.declaration import op_schemas

    return "".join(style(schema) for (ns, _), schema in op_schemas.OP_SCHEMAS.items() if ns == namespace)


def fa4_cute_files() -> dict[str, str]:
    """A tiny stand-in for upstream's ``flash_attn/cute`` (FA4, CuTe DSL Python kernels).

    What the FA4 packaging relies on, and nothing else: modules that import each other by
    absolute ``flash_attn.cute`` names (plain, ``as``, parenthesised multi-line), a
    ``pyproject.toml`` whose dependencies are the ``fa4`` extra's (derived from the extra,
    the one declaration: less what fa4_deps adds, plus what it leaves to our own
    requirements), the licence files that ship, files that must not ship, and a
    ``flash_attn/__init__.py`` that fails when imported, as upstream's does without FA2's
    compiled module: staging and the staged copy must never need it.
    """
    from vendored_flash_attn.families.fa4 import deps as fa4_deps

    pin_dependencies = [r for r in fa4_deps.required() if fa4_deps.requirement_name(r) not in fa4_deps.ADDED_TO_PIN]
    pin_dependencies += list(fa4_deps.NOT_IN_EXTRA)
    listed = ", ".join(f'"{r}"' for r in pin_dependencies)
    return {
        "flash_attn/__init__.py": 'raise ImportError("synthetic upstream: flash_attn needs FA2\'s compiled module")\n',
        "flash_attn/cute/__init__.py": (
            '"""Synthetic FA4."""\n'
            "from importlib.metadata import PackageNotFoundError, version\n"
            "try:\n    __version__ = version(\"fa4\")\nexcept PackageNotFoundError:\n    __version__ = \"0.0.0\"\n"
            "from flash_attn.cute.interface import flash_attn_varlen_func  # noqa: E402\n"),
        "flash_attn/cute/interface.py": (
            "import flash_attn.cute.utils as utils\n"
            "from flash_attn.cute.cache_utils import get_jit_cache\n"
            "from flash_attn.cute import (\n    utils as utils_again,\n)\n\n"
            "def _flash_attn_fwd(q, k, v, **kwargs):\n    return utils.ORIGIN, kwargs\n\n"
            "def flash_attn_varlen_func(q, k, v, **kwargs):\n    return _flash_attn_fwd(q, k, v, **kwargs)\n"),
        "flash_attn/cute/utils.py": "ORIGIN = __name__  # the package this copy lives in\n",
        "flash_attn/cute/cache_utils.py": "def get_jit_cache(kind):\n    return {}\n",
        "flash_attn/cute/sub/__init__.py": "from flash_attn.cute.utils import ORIGIN  # noqa: F401\n",
        "flash_attn/cute/pyproject.toml": (
            '[project]\nname = "fa4"\ndynamic = ["version"]\n'
            f"dependencies = [{listed}]\n"),
        "flash_attn/cute/LICENSE": "BSD 3-Clause License (synthetic)\n",
        "flash_attn/cute/AUTHORS": "synthetic\n",
        "flash_attn/cute/README.md": "# synthetic FA4\n",
        "flash_attn/cute/MANIFEST.in": "include LICENSE\n",
    }


# A fifth, compiled family that no pinned upstream has (tests/build/test_fifth_family.py declares
# it in a copy of the project): its own folder, a registration source, a dispatcher that switches
# head dims and fp16 off by FA5_DISABLE_* defines (as FA3's does), and one instantiation file per
# (head dim, dtype). Its op takes CPU tensors too and writes which kernel function ran (head dim
# * 10 + dtype code) into kernel_id, so a CPU test sees the compiled dispatch; a kernel is launched
# only on a CUDA tensor.
FA5_HEAD_DIMS = (64, 128)
FA5_DTYPES = {"bf16": ("cutlass::bfloat16_t", 0), "fp16": ("cutlass::half_t", 1)}

FA5_FLASH_H = """#pragma once
#include <cstdint>
#include <cuda_runtime.h>
struct Fa5_params { int d; bool is_bf16; int64_t *kernel_id; float *out; };
template<typename T, int Headdim> void run_fa5_fwd_(Fa5_params &params, cudaStream_t stream);
"""

FA5_LAUNCH_TEMPLATE_H = """#pragma once
#include <cutlass/numeric_types.h>
#include "fa5_flash.h"
template<int Headdim, int Code>
__global__ void tiny_fa5_kernel(float *out) { if (out) { out[threadIdx.x] = float(Headdim * 10 + Code); } }
template<typename T, int Headdim, int Code>
void run_fa5_hdim(Fa5_params &params, cudaStream_t stream) {
    *params.kernel_id = Headdim * 10 + Code;
    if (params.out) { tiny_fa5_kernel<Headdim, Code><<<1, 32, 0, stream>>>(params.out); }
}
"""


def _fa5_api_cpp() -> str:
    def branch(ctype: str) -> str:
        return "\n".join(f"#ifndef FA5_DISABLE_HDIM{h}\n        if (p.d == {h}) {{ return run_fa5_fwd_<{ctype}, {h}>(p, s); }}\n#endif"
                         for h in FA5_HEAD_DIMS)
    return f"""#include <cutlass/numeric_types.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>
#include "registration.h"
#include "fa5_flash.h"
using torch::stable::Tensor;
#ifndef FA5_SYNTHETIC
#error "the fa5 family's declared defines did not reach its compile"
#endif
void run_fa5(Fa5_params &p, cudaStream_t s) {{
    if (p.is_bf16) {{
{branch("cutlass::bfloat16_t")}
    }} else {{
#ifndef FA5_DISABLE_FP16
{branch("cutlass::half_t")}
#else
        STD_TORCH_CHECK(false, "FA5 was built without fp16");
#endif
    }}
    STD_TORCH_CHECK(false, "FA5 was built without this head dim");
}}
Tensor fwd(Tensor q, Tensor kernel_id, int64_t head_dim, bool is_bf16) {{
    Fa5_params params{{}};
    params.d = static_cast<int>(head_dim);
    params.is_bf16 = is_bf16;
    params.kernel_id = static_cast<int64_t *>(kernel_id.data_ptr());
    params.out = q.is_cuda() ? static_cast<float *>(q.data_ptr()) : nullptr;
    run_fa5(params, nullptr);
    return q;
}}
STABLE_TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {{
    ops.def("fwd(Tensor! q, Tensor! kernel_id, int head_dim, bool is_bf16) -> Tensor");
}}
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, ops) {{
    ops.impl("fwd", TORCH_BOX(&fwd));
}}
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {{
    ops.impl("fwd", TORCH_BOX(&fwd));
}}
REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
"""


def fa5_files() -> dict[str, str]:
    files = {"fa5/fa5_flash.h": FA5_FLASH_H, "fa5/fa5_launch_template.h": FA5_LAUNCH_TEMPLATE_H,
             "fa5/fa5_api.cpp": _fa5_api_cpp()}
    for hdim in FA5_HEAD_DIMS:
        for dtype, (ctype, code) in FA5_DTYPES.items():
            files[f"fa5/instantiations/fa5_fwd_hdim{hdim}_{dtype}.cu"] = (
                '#include "fa5_launch_template.h"\n\n'
                f"template<> void run_fa5_fwd_<{ctype}, {hdim}>(Fa5_params &params, cudaStream_t stream) {{\n"
                f"    run_fa5_hdim<{ctype}, {hdim}, {code}>(params, stream);\n}}\n")
    return files


def flash_attention_files() -> dict[str, str]:
    files = {
        "CMakeLists.txt": "# synthetic upstream: built by vendored-flash-attn's own CMake\n",
        "csrc/common/registration.h": REGISTRATION_H,
        "csrc/flash_attn/flash_api.cpp": FA2_FLASH_API_CPP,
        "csrc/flash_attn/flash_api_sparse.cpp": FA2_FLASH_API_SPARSE_CPP,
        "csrc/flash_attn/flash_api_torch_lib.cpp": FA2_TORCH_LIB_CPP.replace(
            "@REAL_OP_DEFS@\n", _registrations("_vendored_fa2_C", _fa2_style_def)),
        "csrc/flash_attn/src/namespace_config.h": NAMESPACE_CONFIG_H,
        "csrc/flash_attn/src/flash.h": FA2_FLASH_H,
        "csrc/flash_attn/src/flash_sparse.h": FA2_FLASH_SPARSE_H,
        "csrc/flash_attn/src/static_switch.h": FA2_STATIC_SWITCH_H,
        "csrc/flash_attn/src/cuda_check.h": FA2_CUDA_CHECK_H,
        "csrc/flash_attn/src/flash_fwd_launch_template.h": FA2_LAUNCH_TEMPLATE_H,
        "csrc/flash_attn/src/flash_fwd_sparse_launch_template.h": FA2_SPARSE_LAUNCH_TEMPLATE_H,
        "hopper/flash.h": FA3_FLASH_H,
        "hopper/static_switch.h": FA3_STATIC_SWITCH_H,
        "hopper/flash_fwd_launch_template.h": FA3_LAUNCH_TEMPLATE_H,
        "hopper/flash_api.cpp": _fa3_flash_api_cpp(),
        "hopper/flash_api_torch_lib.cpp": FA3_TORCH_LIB_CPP.replace(
            "@REAL_OP_DEFS@\n", _registrations("_vendored_fa3_C", _fa3_style_def)),
        "hopper/flash_fwd_combine.cu": FA3_COMBINE_CU,
        "hopper/flash_prepare_scheduler.cu": FA3_PREPARE_SCHEDULER_CU,
        # Large files the build never reads stay out of the sparse checkout.
        "assets/big_figure.bin": "x" * 4096,
    }
    files.update({f"csrc/flash_attn/src/{k}": v for k, v in _fa2_instantiations().items()})
    files.update({f"hopper/instantiations/{k}": v for k, v in _fa3_instantiations().items()})
    files.update(fa4_cute_files())
    files.update(fa5_files())
    return files


def cutlass_files() -> dict[str, str]:
    return {
        "include/cutlass/cutlass.h": "#pragma once\n#define CUTLASS_SYNTHETIC 1\n",
        "include/cutlass/numeric_types.h": CUTLASS_NUMERIC_TYPES_H,
        "include/cute/tensor.hpp": "#pragma once\n",
        "media/large.bin": "y" * 4096,
    }


@dataclass
class SyntheticUpstream:
    """Handles to the two synthetic repositories and their pinned commits."""

    root: Path
    flash_attention: Path
    cutlass: Path
    fa_commit: str
    cutlass_commit: str

    @property
    def fa_url(self) -> str:
        return self.flash_attention.as_uri()

    @property
    def cutlass_url(self) -> str:
        return self.cutlass.as_uri()

    def write_pin(self, path: Path, *, fa_tag: str = "", fa_commit: str | None = None,
                  fa_url: str | None = None, cutlass_url: str | None = None) -> Path:
        """A pin file in the real pin's format, naming the synthetic repositories."""
        real_pin = json.loads((Path(__file__).parents[2] / "vendor/flash-attention/pin.json").read_text())
        pin = {
            "flash_attention": dict(real_pin["flash_attention"], url=fa_url or self.fa_url,
                                    commit=fa_commit or self.fa_commit, tag=fa_tag),
            "cutlass": dict(real_pin["cutlass"], url=cutlass_url or self.cutlass_url,
                            commit=self.cutlass_commit, tag=""),
        }
        path.write_text(json.dumps(pin, indent=2))
        self.write_anchor(path)
        return path

    def write_anchor(self, pin_path: Path) -> Path:
        """The pin's anchor (cmake/vfa_build/sources/source_anchor.py), beside it, made from the synthetic repositories
        as `source_anchor.py anchor` makes the real one from a fetch: a commit they lack gets none."""
        pin = json.loads(pin_path.read_text())
        entries = {}
        for name, repo in (("flash_attention", self.flash_attention), ("cutlass", self.cutlass)):
            commit, paths = pin[name]["commit"], pin[name]["paths"]
            try:
                manifest = source_anchor.manifest_from_git(repo, commit, paths)
            except source_anchor.AnchorError:
                continue
            entries[name] = source_anchor.component_entry(commit, paths, manifest)
        out = source_anchor.anchor_path(pin_path)
        source_anchor.write_anchor(out, entries)
        return out

    def new_fa_commit(self, message: str = "another commit") -> str:
        """Another flash-attention commit (for moved tags and other-commit sources), on a
        side branch: HEAD and the working tree stay at the pin, which other tests use."""
        return _side_commit(self.flash_attention, message)

    def new_cutlass_commit(self, message: str = "another commit") -> str:
        return _side_commit(self.cutlass, message)

    def tag_fa(self, tag: str, commit: str) -> None:
        _git(self.flash_attention, "tag", "-f", tag, commit)


def make_synthetic_upstream(root: Path) -> SyntheticUpstream:
    root.mkdir(parents=True, exist_ok=True)
    cutlass = root / "cutlass"
    cutlass.mkdir()
    _git(cutlass, "init", "-q", "-b", "main")
    _write_tree(cutlass, cutlass_files())
    _git(cutlass, "add", "-A")
    _git(cutlass, "commit", "-q", "-m", "synthetic cutlass")
    cutlass_commit = _git(cutlass, "rev-parse", "HEAD")

    fa = root / "flash-attention"
    fa.mkdir()
    _git(fa, "init", "-q", "-b", "main")
    _write_tree(fa, flash_attention_files())
    _git(fa, "add", "-A")
    # CUTLASS as a submodule at csrc/cutlass, like upstream (a gitlink only).
    _git(fa, "update-index", "--add", "--cacheinfo", f"160000,{cutlass_commit},csrc/cutlass")
    (fa / ".gitmodules").write_text('[submodule "csrc/cutlass"]\n\tpath = csrc/cutlass\n\turl = ../cutlass\n')
    _git(fa, "add", ".gitmodules")
    _git(fa, "commit", "-q", "-m", "synthetic flash-attention")
    fa_commit = _git(fa, "rev-parse", "HEAD")
    # Serve filters and by-commit fetches as a hosted remote would.
    for repo in (fa, cutlass):
        _git(repo, "config", "uploadpack.allowFilter", "true")
        _git(repo, "config", "uploadpack.allowAnySHA1InWant", "true")
    return SyntheticUpstream(root, fa, cutlass, fa_commit, cutlass_commit)
