// forward_varlen and forward_kvcache reject what the host can see is wrong before touching
// a GPU, with a message naming the argument, what was expected and what was given (no GPU
// needed: every check here precedes the device query).

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "flash_attention/flash_attention.hpp"

namespace fa = flash_attention;

namespace {

// Distinct, aligned, never dereferenced addresses.
template <class T = void>
T* address(std::uintptr_t gib) {
    return reinterpret_cast<T*>(gib << 30);
}

fa::TensorView view(std::uintptr_t gib, std::int64_t b, std::int64_t s, std::int64_t h,
                    std::int64_t d = 128, fa::DType dtype = fa::DType::BF16) {
    return fa::TensorView::contiguous(address(gib), dtype, b, s, h, d);
}

fa::VarlenParams good_varlen() {
    fa::VarlenParams p;
    p.q = view(1, 1, 1000, 32);
    p.k = view(2, 1, 3000, 8);
    p.v = view(3, 1, 3000, 8);
    p.o = view(4, 1, 1000, 32);
    p.cu_seqlens_q = address<std::int32_t>(5);
    p.cu_seqlens_k = address<std::int32_t>(6);
    p.batch = 4;
    p.max_seqlen_q = 500;
    p.max_seqlen_k = 1500;
    return p;
}

fa::KVCacheParams good_kvcache() {
    fa::KVCacheParams p;
    p.q = view(1, 4, 1, 32);
    p.k_cache = view(2, 4, 4096, 8);
    p.v_cache = view(3, 4, 4096, 8);
    p.o = view(4, 4, 1, 32);
    p.cache_seqlens = address<std::int32_t>(5);
    return p;
}

void expect_error(const std::function<void()>& call, fa::ErrorCode code,
                  const std::string& argument, const std::string& given) {
    try {
        call();
        ADD_FAILURE() << "no error for " << argument;
    } catch (const fa::Error& e) {
        const std::string message = e.what();
        EXPECT_EQ(e.code(), code) << message;
        EXPECT_EQ(message.rfind(argument + ": expected ", 0), 0u) << message;
        EXPECT_NE(message.find(", got " + given), std::string::npos) << message;
    }
}

void varlen_error(const std::function<void(fa::VarlenParams&)>& edit, const std::string& argument,
                  const std::string& given, fa::ErrorCode code = fa::ErrorCode::invalid_argument) {
    fa::VarlenParams p = good_varlen();
    edit(p);
    expect_error([&] { fa::forward_varlen(p); }, code, argument, given);
}

void kvcache_error(const std::function<void(fa::KVCacheParams&)>& edit, const std::string& argument,
                   const std::string& given, fa::ErrorCode code = fa::ErrorCode::invalid_argument) {
    fa::KVCacheParams p = good_kvcache();
    edit(p);
    expect_error([&] { fa::forward_kvcache(p); }, code, argument, given);
}

}  // namespace

TEST(ServingValidation, Varlen) {
    varlen_error([](auto& p) { p.q = view(1, 2, 500, 32); }, "q.shape[0] (batch)", "2");
    varlen_error([](auto& p) { p.cu_seqlens_q = nullptr; }, "cu_seqlens_q", "null");
    varlen_error([](auto& p) { p.cu_seqlens_k = nullptr; }, "cu_seqlens_k", "null");
    varlen_error([](auto& p) { p.batch = 0; }, "batch", "0");
    varlen_error([](auto& p) { p.max_seqlen_q = 1001; }, "max_seqlen_q", "1001");
    varlen_error([](auto& p) { p.num_splits = -1; }, "num_splits", "-1");
    // The lengths are read while other CTAs write O.
    varlen_error([](auto& p) { p.cu_seqlens_q = static_cast<const std::int32_t*>(p.o.data) + 4; },
                 "cu_seqlens_q", "an overlapping range");
    varlen_error(
        [](auto& p) {
            p.q = view(1, 1, 1000, 30);
            p.o = view(4, 1, 1000, 30);
        },
        "q.shape[2] (heads)", "30");
    varlen_error([](auto& p) { p.o = view(4, 1, 999, 32); }, "o.shape[1] (seq)", "999");
    // V's head dim: q's, or one paired with it (DeepSeek's MLA: d_head 192, V's 128); O's is V's.
    varlen_error([](auto& p) { p.v = view(3, 1, 3000, 8, 64); }, "v.shape[3] (d_v)", "64",
                 fa::ErrorCode::unsupported);
    varlen_error([](auto& p) { p.v = view(3, 1, 2999, 8); }, "v.shape[1] (seq)", "2999");
    varlen_error(
        [](auto& p) {
            p.q = view(1, 1, 1000, 32, 192);
            p.k = view(2, 1, 3000, 8, 192);
            p.o = view(4, 1, 1000, 32, 192);
        },
        "o.shape[3] (d_v)", "192");
    varlen_error(
        [](auto& p) {
            p.q = view(1, 1, 1000, 32, 192);
            p.k = view(2, 1, 3000, 8, 192);
            p.v = view(3, 1, 3000, 8, 96);
            p.o = view(4, 1, 1000, 32, 96);
        },
        "v.shape[3] (d_v)", "96", fa::ErrorCode::unsupported);
    varlen_error([](auto& p) { p.k = view(2, 1, 3000, 8, 128, fa::DType::FP16); }, "k.dtype",
                 "FP16", fa::ErrorCode::dtype);
    varlen_error([](auto& p) { p.o = p.q; }, "o", "an overlapping range");
    varlen_error([](auto& p) { p.options.softmax_scale = -1.0f; }, "softmax_scale", "-1");
    varlen_error([](auto& p) { p.options.causal_alignment = fa::CausalAlignment{-1}; },
                 "causal_alignment", "enum value -1");
    // Paged: (num_pages, page_size, heads_kv, d_head) with a table and the key lengths.
    const auto paged = [](fa::VarlenParams& p) {
        p.k = view(2, 64, 16, 8);
        p.v = view(3, 64, 16, 8);
        p.pages = fa::PageTable{address<std::int32_t>(7), 200, 0};
        p.seqused_k = address<std::int32_t>(8);
    };
    varlen_error(
        [&](auto& p) {
            paged(p);
            p.k = view(2, 64, 24, 8);
            p.v = view(3, 64, 24, 8);
        },
        "k.shape[1] (page_size)", "24");
    varlen_error(
        [&](auto& p) {
            paged(p);
            p.pages->block_table = nullptr;
        },
        "pages.block_table", "null");
    varlen_error(
        [&](auto& p) {
            paged(p);
            p.pages->row_stride = 10;
        },
        "pages.row_stride", "10");
    varlen_error(
        [&](auto& p) {
            paged(p);
            p.seqused_k = nullptr;
            p.cu_seqlens_k = nullptr;
        },
        "seqused_k", "neither");
}

namespace {

// An FP8 cache's call: E4M3 q and caches, BF16 o, descales (4 sequences x 8 K/V heads each).
fa::KVCacheParams good_fp8_kvcache() {
    fa::KVCacheParams p;
    p.q = view(1, 4, 1, 32, 128, fa::DType::E4M3);
    p.k_cache = view(2, 4, 4096, 8, 128, fa::DType::E4M3);
    p.v_cache = view(3, 4, 4096, 8, 128, fa::DType::E4M3);
    p.o = view(4, 4, 1, 32);
    p.cache_seqlens = address<std::int32_t>(5);
    p.descales = fa::Fp8Descales{address<float>(8), address<float>(9), address<float>(10)};
    return p;
}

void fp8_kvcache_error(const std::function<void(fa::KVCacheParams&)>& edit,
                       const std::string& argument, const std::string& given,
                       fa::ErrorCode code = fa::ErrorCode::invalid_argument) {
    fa::KVCacheParams p = good_fp8_kvcache();
    edit(p);
    expect_error([&] { fa::forward_kvcache(p); }, code, argument, given);
}

}  // namespace

// An FP8 cache's limits, each named: FP8's dtypes throughout (new rows too), its descales and
// their shape, its head dims (the FP8 kernels' 64, 128 and 256), no variants; descales refused
// with 16-bit inputs.
TEST(ServingValidation, Fp8KVCache) {
    fp8_kvcache_error([](auto& p) { p.descales.reset(); }, "descales", "none");
    fp8_kvcache_error([](auto& p) { p.descales->k = nullptr; }, "descales.k", "a null pointer");
    fp8_kvcache_error([](auto& p) { p.o = view(4, 4, 1, 32, 128, fa::DType::FP16); }, "o.dtype",
                      "FP16", fa::ErrorCode::dtype);
    fp8_kvcache_error([](auto& p) { p.v_cache = view(3, 4, 4096, 8); }, "v_cache.dtype", "BF16",
                      fa::ErrorCode::dtype);
    fp8_kvcache_error(
        [](auto& p) {
            p.k_new = view(6, 4, 1, 8, 128, fa::DType::E4M3);
            p.v_new = view(7, 4, 1, 8);
        },
        "v_new.dtype", "BF16", fa::ErrorCode::dtype);
    fp8_kvcache_error(
        [](auto& p) {
            p.q = view(1, 4, 1, 32, 96, fa::DType::E4M3);
            p.k_cache = view(2, 4, 4096, 8, 96, fa::DType::E4M3);
            p.v_cache = view(3, 4, 4096, 8, 96, fa::DType::E4M3);
            p.o = view(4, 4, 1, 32, 96);
        },
        "q.shape[3] (d_head)", "96", fa::ErrorCode::unsupported);
    fp8_kvcache_error([](auto& p) { p.options.variants.softcap = 30.0f; },
                      "options.variants.softcap", "30", fa::ErrorCode::unsupported);
    // The factors are (q's batch, heads_kv): a cache of more entries does not widen them, and
    // they may not overlap o.
    fp8_kvcache_error([](auto& p) { p.descales->v = static_cast<float*>(p.o.data); }, "descales.v",
                      "an overlapping range");
    kvcache_error(
        [](auto& p) {
            p.descales = fa::Fp8Descales{address<float>(8), address<float>(9), address<float>(10)};
        },
        "descales", "some with BF16 inputs");
}

TEST(ServingValidation, KVCache) {
    kvcache_error([](auto& p) { p.options.causal_alignment = fa::CausalAlignment{2}; },
                  "causal_alignment", "enum value 2");
    kvcache_error(
        [](auto& p) {
            p.k_cache = view(2, 3, 4096, 8);
            p.v_cache = view(3, 3, 4096, 8);
        },
        "k_cache.shape[0] (batch)", "3");
    kvcache_error([](auto& p) { p.v_cache = view(3, 4, 4000, 8); }, "v_cache.shape[1] (seq)",
                  "4000");
    // DeepSeek's MLA: v_cache and v_new with V's 128 columns, O with V's.
    const auto mla = [](fa::KVCacheParams& p) {
        p.q = view(1, 4, 1, 32, 192);
        p.k_cache = view(2, 4, 4096, 8, 192);
        p.o = view(4, 4, 1, 32, 128);
    };
    kvcache_error(
        [&](auto& p) {
            mla(p);
            p.o = view(4, 4, 1, 32, 192);
        },
        "o.shape[3] (d_v)", "192");
    kvcache_error(
        [&](auto& p) {
            mla(p);
            p.k_new = view(6, 4, 1, 8, 192);
            p.v_new = view(7, 4, 1, 8, 192);
        },
        "v_new.shape[3] (d_v)", "192");
    kvcache_error(
        [&](auto& p) {
            mla(p);
            p.k_new = view(6, 4, 2, 8, 192);
            p.v_new = view(7, 4, 1, 8, 128);
        },
        "v_new.shape[1] (seq)", "1");
    kvcache_error([](auto& p) { p.num_splits = 300; }, "num_splits", "300");
    kvcache_error([](auto& p) { p.k_cache.dtype = fa::DType::FP16; }, "k_cache.dtype", "FP16",
                  fa::ErrorCode::dtype);
    kvcache_error([](auto& p) { p.k_new = view(6, 4, 1, 8); }, "v_new", "none");
    kvcache_error(
        [](auto& p) {
            p.k_new = view(6, 4, 1, 8);
            p.v_new = view(7, 4, 1, 8);
            p.cache_seqlens = nullptr;
        },
        "cache_seqlens", "null");
    kvcache_error(
        [](auto& p) {
            p.k_new = view(6, 4, 1, 4);
            p.v_new = view(7, 4, 1, 4);
        },
        "k_new.shape[2] (heads)", "4");
    kvcache_error(
        [](auto& p) {
            p.k_new = view(6, 4, 1, 8);
            p.v_new = p.k_cache;
            p.v_new->shape = {4, 1, 8, 128};
        },
        "v_new", "an overlapping range");
    kvcache_error(
        [](auto& p) {
            p.q = view(1, 4, 1, 32, 80);
            p.o = view(4, 4, 1, 32, 80);
        },
        "q.shape[3] (d_head)", "80", fa::ErrorCode::unsupported);
    kvcache_error([](auto& p) { p.options.lse = address<float>(1); }, "lse",
                  "an overlapping range");
    // Appending writes the caches: each row an element's own (not a batch stride of 0, which
    // appends two sequences to one row), apart from each other and from what the call reads.
    const auto append = [](fa::KVCacheParams& p) {
        p.k_new = view(6, 4, 1, 8);
        p.v_new = view(7, 4, 1, 8);
    };
    kvcache_error(
        [&](auto& p) {
            append(p);
            p.v_cache = p.k_cache;
        },
        "k_cache", "an overlapping range");
    kvcache_error(
        [&](auto& p) {
            append(p);
            p.k_cache.stride[0] = 0;
        },
        "k_cache.stride[0] (batch)", "0");
    kvcache_error(
        [&](auto& p) {
            append(p);
            p.cache_seqlens = static_cast<const std::int32_t*>(p.v_cache.data) + 8;
        },
        "cache_seqlens", "an overlapping range");
    kvcache_error(
        [&](auto& p) {
            append(p);
            p.options.variants.sinks = static_cast<const float*>(p.k_cache.data);
        },
        "variants.sinks", "an overlapping range");
    kvcache_error([](auto& p) { p.options.variants.sinks = static_cast<const float*>(p.o.data); },
                  "variants.sinks", "an overlapping range");
    kvcache_error([](auto& p) { p.cache_seqlens = static_cast<const std::int32_t*>(p.o.data) + 4; },
                  "cache_seqlens", "an overlapping range");
    // Without k_new the caches are read only: a batch stride of 0 shares one cache.
    {
        fa::KVCacheParams p = good_kvcache();
        p.k_cache.stride[0] = p.v_cache.stride[0] = 0;
        try {
            fa::forward_kvcache(p);
        } catch (const fa::Error& e) {
            // The call gets past the caches' checks and stops later: at the device query on a
            // machine without a GPU, at the made-up addresses' memory check on one with a GPU.
            const std::string message = e.what();
            EXPECT_NE(message.rfind("k_cache", 0), 0u) << message;
            EXPECT_NE(message.rfind("v_cache", 0), 0u) << message;
        }
    }
    // A page table's rows row_stride apart fit the address space (the kernels index it in 64
    // bits).
    kvcache_error(
        [](auto& p) {
            p.pages = fa::PageTable{address<std::int32_t>(7), 4, std::int64_t{1} << 62};
            p.k_cache = view(2, 64, 16, 8);
            p.v_cache = view(3, 64, 16, 8);
        },
        "pages.row_stride", std::to_string(std::int64_t{1} << 62));
    kvcache_error(
        [](auto& p) {
            p.pages = fa::PageTable{address<std::int32_t>(7), 0, 0};
            p.k_cache = view(2, 64, 16, 8);
            p.v_cache = view(3, 64, 16, 8);
        },
        "pages.max_pages_per_seq", "0");
}
