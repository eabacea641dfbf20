// The flash_attention_scratch._C extension: the C++ library's API for Python. Arrays arrive
// through DLPack (nanobind's ndarray), PyTorch tensors through a faster attribute route
// (see view_of_torch); no PyTorch headers are compiled in. The Python layer passes
// PyTorch's current CUDA stream as an integer.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "flash_attention/flash_attention.hpp"

namespace nb = nanobind;
namespace fa = flash_attention;

namespace {

using CudaArray = nb::ndarray<nb::device::cuda>;

fa::DType dtype_of(const CudaArray& a, const char* name) {
    const nb::dlpack::dtype t = a.dtype();
    if (t.bits == 16 && t.lanes == 1 &&
        t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float)) {
        return fa::DType::FP16;
    }
    if (t.bits == 16 && t.lanes == 1 &&
        t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat)) {
        return fa::DType::BF16;
    }
    throw fa::Error(fa::ErrorCode::dtype,
                    std::string(name) + ".dtype: expected float16 or bfloat16, got a " +
                        std::to_string(t.bits) + "-bit type with DLPack code " +
                        std::to_string(t.code));
}

fa::TensorView view_of(const CudaArray& a, const char* name) {
    if (a.ndim() != 4) {
        throw fa::Error(fa::ErrorCode::invalid_argument,
                        std::string(name) +
                            ": expected 4 dimensions (batch, seq, heads, d_head), got " +
                            std::to_string(a.ndim()));
    }
    fa::TensorView v;
    v.data = const_cast<void*>(a.data());
    v.dtype = dtype_of(a, name);
    for (int i = 0; i < 4; ++i) {
        v.shape[i] = static_cast<std::int64_t>(a.shape(i));
        v.stride[i] = static_cast<std::int64_t>(a.stride(i));
    }
    return v;
}

// PyTorch tensors take a faster route than DLPack: torch.Tensor.__dlpack__ costs about
// 3 µs per tensor (measured on the H100 machine, docs/PERF.md), more than the whole C++
// call, while reading is_cuda, dtype, data_ptr(), shape and stride() through Python
// attribute calls costs a fraction of that, still without PyTorch headers. Everything
// else (CuPy, JAX, ...) crosses by DLPack.
struct TorchTypes {
    nb::object tensor, float16, bfloat16, float32;
    nb::object float8_e4m3fn;  // None on a PyTorch without it
    // Interned attribute names: a lookup by C string would build a new str every time.
    nb::object is_cuda, dtype, shape, stride, data_ptr, device;
};

// Only when PyTorch is already imported: this module never imports it.
const TorchTypes* torch_types() {
    static std::optional<TorchTypes> types;
    if (!types) {
        nb::dict modules = nb::borrow<nb::dict>(PyImport_GetModuleDict());
        if (!modules.contains("torch"))
            return nullptr;
        nb::object torch = modules["torch"];
        const auto name = [](const char* s) { return nb::steal(PyUnicode_InternFromString(s)); };
        types = TorchTypes{torch.attr("Tensor"),
                           torch.attr("float16"),
                           torch.attr("bfloat16"),
                           torch.attr("float32"),
                           nb::getattr(torch, "float8_e4m3fn", nb::none()),
                           name("is_cuda"),
                           name("dtype"),
                           name("shape"),
                           name("stride"),
                           name("data_ptr"),
                           name("device")};
    }
    return &*types;
}

nb::object get(nb::handle object, const nb::object& name) {
    PyObject* value = PyObject_GetAttr(object.ptr(), name.ptr());
    if (value == nullptr)
        throw nb::python_error();
    return nb::steal(value);
}

nb::object call(nb::handle object, const nb::object& name) {
    PyObject* value = PyObject_CallMethodNoArgs(object.ptr(), name.ptr());
    if (value == nullptr)
        throw nb::python_error();
    return nb::steal(value);
}

fa::TensorView view_of_torch(nb::handle t, const TorchTypes& torch, const char* name) {
    if (get(t, torch.is_cuda).ptr() != Py_True) {
        throw fa::Error(fa::ErrorCode::invalid_argument,
                        std::string(name) + ": expected a CUDA tensor, got one on " +
                            nb::cast<std::string>(nb::str(get(t, torch.device))));
    }
    fa::TensorView v;
    const nb::object dtype = get(t, torch.dtype);
    if (dtype.is(torch.float16)) {
        v.dtype = fa::DType::FP16;
    } else if (dtype.is(torch.bfloat16)) {
        v.dtype = fa::DType::BF16;
    } else if (!torch.float8_e4m3fn.is_none() && dtype.is(torch.float8_e4m3fn)) {
        v.dtype = fa::DType::E4M3;  // FP8: the API checks which entry points take it
    } else {
        throw fa::Error(fa::ErrorCode::dtype,
                        std::string(name) +
                            ".dtype: expected torch.float16, torch.bfloat16 or (FP8) "
                            "torch.float8_e4m3fn, got " +
                            nb::cast<std::string>(nb::str(dtype)));
    }
    // torch.Size is a tuple, and stride() returns one.
    const nb::object shape = get(t, torch.shape);
    const nb::object stride = call(t, torch.stride);
    if (!PyTuple_Check(shape.ptr()) || !PyTuple_Check(stride.ptr())) {
        throw fa::Error(fa::ErrorCode::invalid_argument,
                        std::string(name) + ": expected shape and stride tuples");
    }
    const auto ndim = PyTuple_GET_SIZE(shape.ptr());
    if (ndim != 4 || PyTuple_GET_SIZE(stride.ptr()) != 4) {
        throw fa::Error(fa::ErrorCode::invalid_argument,
                        std::string(name) +
                            ": expected 4 dimensions (batch, seq, heads, d_head), got " +
                            std::to_string(ndim));
    }
    v.data = PyLong_AsVoidPtr(call(t, torch.data_ptr).ptr());
    for (int i = 0; i < 4; ++i) {
        v.shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
        v.stride[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride.ptr(), i));
    }
    if (PyErr_Occurred())
        throw nb::python_error();
    return v;
}

fa::TensorView view_of(nb::handle t, const char* name) {
    if (const TorchTypes* torch = torch_types();
        torch && PyObject_IsInstance(t.ptr(), torch->tensor.ptr()) == 1) {
        return view_of_torch(t, *torch, name);
    }
    CudaArray array;
    if (!nb::try_cast(t, array)) {
        throw fa::Error(
            fa::ErrorCode::invalid_argument,
            std::string(name) + ": expected a CUDA array (PyTorch tensor or DLPack-capable), got " +
                nb::cast<std::string>(
                    nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(t.ptr()))))));
    }
    return view_of(array, name);
}

// An optional log-sum-exp (or its gradient): a contiguous float32 CUDA array of `elements`
// values.
float* lse_pointer(nb::handle lse, std::size_t elements, const char* name = "lse") {
    if (lse.is_none())
        return nullptr;
    if (const TorchTypes* torch = torch_types();
        torch && PyObject_IsInstance(lse.ptr(), torch->tensor.ptr()) == 1) {
        const bool ok = get(lse, torch->is_cuda).ptr() == Py_True &&
                        get(lse, torch->dtype).is(torch->float32) &&
                        nb::cast<bool>(lse.attr("is_contiguous")()) &&
                        nb::cast<std::size_t>(lse.attr("numel")()) == elements;
        if (!ok) {
            throw fa::Error(fa::ErrorCode::invalid_argument,
                            std::string(name) + ": expected a contiguous float32 CUDA tensor of " +
                                std::to_string(elements) + " elements (batch, heads, seq_q), got " +
                                nb::cast<std::string>(nb::repr(lse)).substr(0, 120));
        }
        return reinterpret_cast<float*>(PyLong_AsVoidPtr(call(lse, torch->data_ptr).ptr()));
    }
    nb::ndarray<float, nb::device::cuda, nb::c_contig> array;
    if (!nb::try_cast(lse, array) || array.size() != elements) {
        throw fa::Error(fa::ErrorCode::invalid_argument,
                        std::string(name) + ": expected a contiguous float32 CUDA array of " +
                            std::to_string(elements) + " elements (batch, heads, seq_q)");
    }
    return array.data();
}

// The options of a call from the Python layer's arguments: causal masking as one int (0
// none, 1 aligned at the bottom right, 2 at the top left), the variants (the window's sides,
// the softcap, the addresses of its checked float32 sinks and ALiBi slopes, 0: none, and the
// slopes' batch stride) and the optional LSE of `lse_elements` floats.
fa::AttentionOptions options_of(std::optional<float> scale, int causal, nb::handle lse,
                                std::size_t lse_elements, int window_left, int window_right,
                                float softcap, std::uintptr_t sinks, std::uintptr_t alibi_slopes,
                                std::int64_t alibi_batch_stride) {
    // 3: no causal masking, the diagonal of a window or of ALiBi aligned at the top left.
    if (causal < 0 || causal > 3) {
        throw fa::Error(fa::ErrorCode::invalid_argument,
                        "causal: expected 0 (none), 1 (bottom right), 2 (top left) or 3 (none, a "
                        "window or ALiBi aligned at the top left), got " +
                            std::to_string(causal));
    }
    return {.softmax_scale = scale,
            .causal = causal == 1 || causal == 2,
            .causal_alignment =
                causal >= 2 ? fa::CausalAlignment::top_left : fa::CausalAlignment::bottom_right,
            .lse = lse_pointer(lse, lse_elements),
            .variants = {window_left, window_right, softcap, reinterpret_cast<const float*>(sinks),
                         reinterpret_cast<const float*>(alibi_slopes), alibi_batch_stride}};
}

// The backward's options and gradient arguments, dense or packed (BackwardParams,
// VarlenBackwardParams): the options with the forward's LSE, which the backward requires, of
// `rows` floats (its shape as `lse_shape` says), and dLSE, determinism and dsinks.
template <class Params>
void set_backward_arguments(Params& p, std::optional<float> scale, int causal, nb::handle lse,
                            std::size_t rows, const char* lse_shape, int window_left,
                            int window_right, float softcap, std::uintptr_t sinks,
                            std::uintptr_t alibi_slopes, std::int64_t alibi_batch_stride,
                            nb::handle d_lse, bool deterministic, std::uintptr_t d_sinks) {
    p.options = options_of(scale, causal, lse, rows, window_left, window_right, softcap, sinks,
                           alibi_slopes, alibi_batch_stride);
    if (p.options.lse == nullptr) {
        throw fa::Error(fa::ErrorCode::invalid_argument,
                        std::string("lse: expected the forward's log-sum-exp (float32 ") +
                            lse_shape + "), got None");
    }
    p.d_lse = lse_pointer(d_lse, rows, "dlse");
    p.deterministic = deterministic;
    p.d_sinks = reinterpret_cast<float*>(d_sinks);
}

// A paged cache's table from the Python layer's address (0: not paged) and its shape.
std::optional<fa::PageTable> page_table(std::uintptr_t block_table, std::int64_t max_pages,
                                        std::int64_t row_stride) {
    if (block_table == 0)
        return std::nullopt;
    return fa::PageTable{reinterpret_cast<const std::int32_t*>(block_table), max_pages, row_stride};
}

// A library error's message names the C++ API's argument first ("variants.softcap: expected
// ..."; fail() in validate.cpp). A Python caller wrote other names for some of them: those are
// put in its place, so that the message names what the caller passed.
std::string python_message(std::string message) {
    static constexpr std::pair<std::string_view, std::string_view> names[] = {
        {"variants.window_left", "window_size[0]"},
        {"variants.window_right", "window_size[1]"},
        {"variants.softcap", "softcap"},
        {"variants.sinks", "learnable_sink"},
        {"variants.alibi_slopes", "alibi_slopes"},
        {"variants.alibi_batch_stride", "alibi_slopes"},
        {"o", "out"},
        {"k_new", "k"},  // forward_kvcache's and flash_attn_with_kvcache's new keys
        {"v_new", "v"},
        {"pages.block_table", "block_table"},
        {"descales.q", "q_descale"},
        {"descales.k", "k_descale"},
        {"descales.v", "v_descale"},
    };
    for (const auto& [cpp, python] : names) {
        // The name whole, then the end of the argument or a part of it (o.shape[1], o.data).
        if (message.starts_with(cpp) && message.size() > cpp.size() &&
            std::string_view(".:[ ").find(message[cpp.size()]) != std::string_view::npos) {
            return std::string(python) + message.substr(cpp.size());
        }
    }
    return message;
}

}  // namespace

NB_MODULE(_C, m) {
    m.doc() =
        "FlashAttention kernels, forward and backward (C++/CUDA); use the flash_attention_scratch "
        "package, not "
        "this "
        "module.";

    // Library errors keep their message, with the argument it names in the Python API's words
    // (python_message), and become the Python exception that fits.
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const fa::Error& e) {
            const std::string message = python_message(e.what());
            switch (e.code()) {
                case fa::ErrorCode::dtype:
                    PyErr_SetString(PyExc_TypeError, message.c_str());
                    break;
                case fa::ErrorCode::cuda:
                case fa::ErrorCode::no_device:
                    PyErr_SetString(PyExc_RuntimeError, message.c_str());
                    break;
                default:
                    PyErr_SetString(PyExc_ValueError, message.c_str());
            }
        }
    });
    m.def("_python_message", &python_message,
          "A library error's message as the Python layer raises it (for its tests).");

    m.attr("__version__") = std::string(fa::version());

    nb::enum_<fa::DType>(m, "DType")
        .value("FP16", fa::DType::FP16)
        .value("BF16", fa::DType::BF16)
        .value("E4M3", fa::DType::E4M3);
    nb::enum_<fa::Family>(m, "Family")
        .value("sm80", fa::Family::sm80)
        .value("sm90", fa::Family::sm90);

    nb::class_<fa::KernelConfig> config(m, "KernelConfig", "Every knob of one compiled kernel.");
    // Every field of the table, read-only.
    // (flat names: each family's knobs are nested in C++, c.sm90.stages, and plain here)
#define FLASH_ATTENTION_BIND_FIELD(type, name, init, bits, family, ...) \
    config.def_prop_ro(                                                 \
        #name, [](const fa::KernelConfig& c) { return FLASH_ATTENTION_FIELD(c, family, name); });
    FLASH_ATTENTION_CONFIG_FIELDS(FLASH_ATTENTION_BIND_FIELD)
#undef FLASH_ATTENTION_BIND_FIELD
    config
        .def_static("parse", &fa::KernelConfig::parse, nb::arg("short_form"),
                    "Parses a short form such as '(BF16, 128, 128, 64, 4): async+eager+swizzled+"
                    "load_1_1_1_tiles+buffer+opt_softmax'; raises ValueError naming the bad token.")
        .def("smem_bytes", &fa::shared_memory_bytes,
             "Dynamic shared memory one CTA of this kernel takes, in bytes.")
        .def("is_built", [](const fa::KernelConfig& c) { return fa::is_built(c); })
        .def(
            "is_supported", [](const fa::KernelConfig& c) { return fa::is_supported(c); },
            "Built, and the current GPU can run it (sm90 kernels need compute capability 9.0); "
            "False without a GPU.")
        .def("__str__", &fa::KernelConfig::to_string)
        .def(
            "__repr__",
            [](const fa::KernelConfig& c) { return "KernelConfig.parse('" + c.to_string() + "')"; })
        // Operators: another type's operand gets NotImplemented rather than TypeError, so
        // that Python falls back to identity (cfg == None is False, cfg in [None, cfg] works).
        .def(
            "__eq__", [](const fa::KernelConfig& a, const fa::KernelConfig& b) { return a == b; },
            nb::is_operator())
        .def(
            "__ne__", [](const fa::KernelConfig& a, const fa::KernelConfig& b) { return a != b; },
            nb::is_operator())
        .def(
            "__lt__", [](const fa::KernelConfig& a, const fa::KernelConfig& b) { return a < b; },
            nb::is_operator())
        .def("__hash__",
             [](const fa::KernelConfig& c) { return std::hash<fa::KernelConfig>{}(c); });

    m.def("configs", &fa::configs, "Every config compiled into this build.");
    m.def("device_count", &fa::device_count, "CUDA devices this process sees (0 without a GPU).");
    m.def("reload_tuning_cache", &fa::reload_tuning_cache);
    m.def("release_cached_memory", &fa::release_cached_memory,
          "Hands the device memory the library's pool keeps between calls (the backward's dQ "
          "accumulator, twice Q's bytes) back to the driver; the next call maps it again.");

    m.def(
        "forward",
        [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, std::optional<float> scale,
           std::optional<fa::KernelConfig> config, std::uintptr_t stream, int causal,
           nb::handle lse, int window_left, int window_right, float softcap, std::uintptr_t sinks,
           std::uintptr_t alibi_slopes, std::int64_t alibi_batch_stride, std::uintptr_t q_descale,
           std::uintptr_t k_descale, std::uintptr_t v_descale) {
            fa::ForwardParams p{view_of(q, "q"), view_of(k, "k"), view_of(v, "v"),
                                view_of(out, "out")};
            p.options = options_of(
                scale, causal, lse,
                static_cast<std::size_t>(p.q.shape[0] * p.q.shape[2] * p.q.shape[1]), window_left,
                window_right, softcap, sinks, alibi_slopes, alibi_batch_stride);
            if (q_descale != 0 || k_descale != 0 || v_descale != 0) {
                p.descales = fa::Fp8Descales{reinterpret_cast<const float*>(q_descale),
                                             reinterpret_cast<const float*>(k_descale),
                                             reinterpret_cast<const float*>(v_descale)};
            }
            const auto s = reinterpret_cast<fa::Stream>(stream);
            if (config) {
                fa::forward(p, *config, s);
            } else {
                fa::forward(p, s);
            }
        },
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("softmax_scale").none(),
        nb::arg("config").none(), nb::arg("stream"), nb::arg("causal") = 0,
        nb::arg("lse").none() = nb::none(), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f, nb::arg("sinks") = 0,
        nb::arg("alibi_slopes") = 0, nb::arg("alibi_batch_stride") = 0, nb::arg("q_descale") = 0,
        nb::arg("k_descale") = 0, nb::arg("v_descale") = 0,
        "Writes attention of (batch, seq, heads, d_head) CUDA arrays into `out` (and the\n"
        "log-sum-exp into `lse`, float32 (batch, heads, seq_q), when given) on `stream`.\n"
        "window_left/right, softcap: -1, 0: none. sinks: the address of checked float32\n"
        "(heads,) sinks; alibi_slopes: of checked float32 (heads,) or (batch, heads) slopes\n"
        "(0: none), alibi_batch_stride: heads for the latter, 0 for the former. FP8\n"
        "(float8_e4m3fn q, k and v, a bfloat16 out): q_descale, k_descale and v_descale, the\n"
        "addresses of checked float32 (batch, heads_kv) descales (0: none).");

    // The serving entry points. The Python layer checks the int32 index tensors (lengths,
    // offsets, page table) and passes their addresses; null is 0.
    m.def(
        "forward_varlen",
        [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, std::uintptr_t cu_seqlens_q,
           std::uintptr_t cu_seqlens_k, std::uintptr_t seqused_k, std::uintptr_t block_table,
           std::int64_t max_pages, std::int64_t table_stride, std::int64_t batch,
           std::int64_t max_seqlen_q, std::int64_t max_seqlen_k, std::optional<float> scale,
           int causal, nb::handle lse, int num_splits, std::uintptr_t stream, int window_left,
           int window_right, float softcap, std::uintptr_t sinks, std::uintptr_t alibi_slopes,
           std::int64_t alibi_batch_stride, bool check_only) {
            fa::VarlenParams p;
            p.q = view_of(q, "q");
            p.k = view_of(k, "k");
            p.v = view_of(v, "v");
            p.o = view_of(out, "out");
            p.cu_seqlens_q = reinterpret_cast<const std::int32_t*>(cu_seqlens_q);
            p.cu_seqlens_k = reinterpret_cast<const std::int32_t*>(cu_seqlens_k);
            p.seqused_k = reinterpret_cast<const std::int32_t*>(seqused_k);
            p.pages = page_table(block_table, max_pages, table_stride);
            p.batch = batch;
            p.max_seqlen_q = max_seqlen_q;
            p.max_seqlen_k = max_seqlen_k;
            p.options = options_of(
                scale, causal, lse, static_cast<std::size_t>(p.q.shape[1] * p.q.shape[2]),
                window_left, window_right, softcap, sinks, alibi_slopes, alibi_batch_stride);
            p.num_splits = num_splits;
            if (check_only) {
                fa::chosen_kernel(p);  // every check and the route, no launch
                return;
            }
            fa::forward_varlen(p, reinterpret_cast<fa::Stream>(stream));
        },
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("seqused_k"), nb::arg("block_table"), nb::arg("max_pages"),
        nb::arg("table_stride"), nb::arg("batch"), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("lse").none(),
        nb::arg("num_splits"), nb::arg("stream"), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f, nb::arg("sinks") = 0,
        nb::arg("alibi_slopes") = 0, nb::arg("alibi_batch_stride") = 0,
        nb::arg("check_only") = false,
        "Attention over packed sequences: (1, total, heads, d_head) arrays (see VarlenParams);\n"
        "the variants as forward's, the sequences ALiBi's batch entries. check_only: the call's\n"
        "checks and route alone (what it would raise), no launch.");

    m.def(
        "backward_varlen",
        [](nb::handle d_o, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
           nb::handle dq, nb::handle dk, nb::handle dv, std::uintptr_t cu_seqlens_q,
           std::uintptr_t cu_seqlens_k, std::uintptr_t seqused_k, std::int64_t batch,
           std::int64_t max_seqlen_q, std::int64_t max_seqlen_k, std::optional<float> scale,
           int causal, std::uintptr_t stream, nb::handle d_lse, bool deterministic,
           std::uintptr_t sinks, std::uintptr_t d_sinks, float softcap, int window_left,
           int window_right, std::uintptr_t alibi_slopes, std::int64_t alibi_batch_stride) {
            fa::VarlenBackwardParams p;
            p.q = view_of(q, "q");
            p.k = view_of(k, "k");
            p.v = view_of(v, "v");
            p.o = view_of(out, "out");
            p.d_o = view_of(d_o, "dout");
            p.dq = view_of(dq, "dq");
            p.dk = view_of(dk, "dk");
            p.dv = view_of(dv, "dv");
            p.cu_seqlens_q = reinterpret_cast<const std::int32_t*>(cu_seqlens_q);
            p.cu_seqlens_k = reinterpret_cast<const std::int32_t*>(cu_seqlens_k);
            p.seqused_k = reinterpret_cast<const std::int32_t*>(seqused_k);
            p.batch = batch;
            p.max_seqlen_q = max_seqlen_q;
            p.max_seqlen_k = max_seqlen_k;
            set_backward_arguments(p, scale, causal, lse,
                                   static_cast<std::size_t>(p.q.shape[1] * p.q.shape[2]),
                                   "(heads, total_q)", window_left, window_right, softcap, sinks,
                                   alibi_slopes, alibi_batch_stride, d_lse, deterministic, d_sinks);
            fa::backward_varlen(p, reinterpret_cast<fa::Stream>(stream));
        },
        nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("seqused_k"), nb::arg("batch"), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("softmax_scale").none(), nb::arg("causal"),
        nb::arg("stream"), nb::arg("dlse").none() = nb::none(), nb::arg("deterministic") = false,
        nb::arg("sinks") = 0, nb::arg("d_sinks") = 0, nb::arg("softcap") = 0.0f,
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("alibi_slopes") = 0,
        nb::arg("alibi_batch_stride") = 0,
        "Writes the gradients of forward_varlen into dq, dk and dv (see VarlenBackwardParams): "
        "(1, total, heads, d_head) arrays, the offsets' addresses, lse (heads, total_q);\n"
        "the variants as backward's.");

    m.def(
        "forward_kvcache",
        [](nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out,
           std::uintptr_t cache_seqlens, std::uintptr_t block_table, std::int64_t max_pages,
           std::int64_t table_stride, nb::handle k_new, nb::handle v_new,
           std::optional<float> scale, int causal, nb::handle lse, int num_splits,
           std::uintptr_t stream, int window_left, int window_right, float softcap,
           std::uintptr_t sinks, std::uintptr_t alibi_slopes, std::int64_t alibi_batch_stride,
           std::uintptr_t q_descale, std::uintptr_t k_descale, std::uintptr_t v_descale) {
            fa::KVCacheParams p;
            p.q = view_of(q, "q");
            p.k_cache = view_of(k_cache, "k_cache");
            p.v_cache = view_of(v_cache, "v_cache");
            p.o = view_of(out, "out");
            p.cache_seqlens = reinterpret_cast<const std::int32_t*>(cache_seqlens);
            p.pages = page_table(block_table, max_pages, table_stride);
            if (!k_new.is_none())
                p.k_new = view_of(k_new, "k");
            if (!v_new.is_none())
                p.v_new = view_of(v_new, "v");
            p.options = options_of(
                scale, causal, lse,
                static_cast<std::size_t>(p.q.shape[0] * p.q.shape[1] * p.q.shape[2]), window_left,
                window_right, softcap, sinks, alibi_slopes, alibi_batch_stride);
            p.num_splits = num_splits;
            if (q_descale != 0 || k_descale != 0 || v_descale != 0) {
                p.descales = fa::Fp8Descales{reinterpret_cast<const float*>(q_descale),
                                             reinterpret_cast<const float*>(k_descale),
                                             reinterpret_cast<const float*>(v_descale)};
            }
            fa::forward_kvcache(p, reinterpret_cast<fa::Stream>(stream));
        },
        nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("out"),
        nb::arg("cache_seqlens"), nb::arg("block_table"), nb::arg("max_pages"),
        nb::arg("table_stride"), nb::arg("k_new").none(), nb::arg("v_new").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal"), nb::arg("lse").none(),
        nb::arg("num_splits"), nb::arg("stream"), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.0f, nb::arg("sinks") = 0,
        nb::arg("alibi_slopes") = 0, nb::arg("alibi_batch_stride") = 0, nb::arg("q_descale") = 0,
        nb::arg("k_descale") = 0, nb::arg("v_descale") = 0,
        "Attention against a KV cache, appending k_new/v_new first (see KVCacheParams); the\n"
        "variants as forward's; an FP8 cache's descales as forward's (0: none).");

    m.def(
        "backward",
        [](nb::handle d_o, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
           nb::handle dq, nb::handle dk, nb::handle dv, std::optional<float> scale, int causal,
           std::uintptr_t stream, nb::handle d_lse, std::optional<fa::KernelConfig> config,
           bool deterministic, std::uintptr_t sinks, std::uintptr_t d_sinks, float softcap,
           int window_left, int window_right, std::uintptr_t alibi_slopes,
           std::int64_t alibi_batch_stride) {
            fa::BackwardParams p{view_of(q, "q"),     view_of(k, "k"),      view_of(v, "v"),
                                 view_of(out, "out"), view_of(d_o, "dout"), view_of(dq, "dq"),
                                 view_of(dk, "dk"),   view_of(dv, "dv")};
            set_backward_arguments(
                p, scale, causal, lse,
                static_cast<std::size_t>(p.q.shape[0] * p.q.shape[2] * p.q.shape[1]),
                "(batch, heads, seq_q)", window_left, window_right, softcap, sinks, alibi_slopes,
                alibi_batch_stride, d_lse, deterministic, d_sinks);
            const auto s = reinterpret_cast<fa::Stream>(stream);
            if (config) {
                fa::backward(p, *config, s);
            } else {
                fa::backward(p, s);
            }
        },
        nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("softmax_scale").none(),
        nb::arg("causal"), nb::arg("stream"), nb::arg("dlse").none() = nb::none(),
        nb::arg("config").none() = nb::none(), nb::arg("deterministic") = false,
        nb::arg("sinks") = 0, nb::arg("d_sinks") = 0, nb::arg("softcap") = 0.0f,
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("alibi_slopes") = 0,
        nb::arg("alibi_batch_stride") = 0,
        "Writes the gradients of attention into dq, dk and dv (see BackwardParams): dout, q, k, "
        "v,\n"
        "out as the forward's, lse its float32 (batch, heads, seq_q) log-sum-exp, dlse optional;\n"
        "deterministic: bitwise-identical gradients from run to run; sinks: the forward's (the\n"
        "address of checked float32 (heads,) sinks, 0: none), d_sinks: where their gradient goes\n"
        "(0: not computed); softcap, window_left/right, alibi_slopes and alibi_batch_stride: the\n"
        "forward's (0, -1, 0: none; the slopes get no gradient).");

    m.def(
        "choose_config",
        [](nb::handle q, nb::handle k, nb::handle v, nb::handle out) {
            return fa::choose_config(fa::ForwardParams{view_of(q, "q"), view_of(k, "k"),
                                                       view_of(v, "v"), view_of(out, "out")});
        },
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        "The config forward() would run.");
}
