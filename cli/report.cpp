#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

namespace flash_attention::cli {

std::vector<int> varlen_lengths(const Shape& shape) {
    std::mt19937 random(0x5eed + static_cast<unsigned>(shape.batch) * 31u +
                        static_cast<unsigned>(shape.seq_q));
    std::uniform_int_distribution<int> length(1, std::max(1, shape.seq_q));
    std::vector<int> lengths(static_cast<std::size_t>(shape.batch));
    for (int& l : lengths)
        l = length(random);
    return lengths;
}

std::string api_name(const Shape& s) {
    switch (s.api) {
        case Api::kvcache:
            return s.page_size > 0 ? "paged " + std::to_string(s.page_size) : "kvcache";
        case Api::varlen:
            return "varlen";
        case Api::dense:
            break;
    }
    return "dense";
}

double Shape::flop() const {
    // 2 x heads x (d_head + V's head dim): S = Q·Kᵀ over d_head, O = P·V over V's.
    const double per_pair = (backward ? 2.5 : 1.0) * 2.0 * heads * (d_head + v_head_dim());
    if (window_left >= 0 || window_right >= 0) {
        // Row i (diagonal position i + keys - queries) sees [pos - left, pos + right] of the
        // keys; varlen: each sequence its own.
        const auto pairs_of = [&](double queries, double keys) {
            const double right = causal ? 0 : window_right;
            double pairs = 0;
            for (double i = 0; i < queries; ++i) {
                const double pos = i + keys - queries;
                const double lo = window_left >= 0 ? std::max(0.0, pos - window_left) : 0.0;
                const double hi = right >= 0 ? std::min(keys, pos + right + 1) : keys;
                pairs += std::max(0.0, hi - lo);
            }
            return pairs;
        };
        if (api != Api::varlen)
            return per_pair * batch * pairs_of(seq_q, seq_k);
        double pairs = 0;
        for (const int n : varlen_lengths(*this))
            pairs += pairs_of(n, n);
        return per_pair * pairs;
    }
    if (api == Api::dense)
        return per_pair * batch * double(seq_q) * seq_k / (causal ? 2 : 1);
    if (api == Api::varlen) {
        double pairs = 0;
        for (const int n : varlen_lengths(*this))
            pairs += causal ? 0.5 * n * (n + 1.0) : double(n) * n;
        return per_pair * pairs;
    }
    // kvcache: query i sees min(seq_k, seq_k - seq_q + i + 1) keys with causal masking.
    double pairs = double(seq_q) * seq_k;
    if (causal) {
        pairs = 0;
        for (int i = 0; i < seq_q; ++i)
            pairs += std::clamp(double(seq_k) - seq_q + i + 1, 0.0, double(seq_k));
    }
    return per_pair * batch * pairs;
}

double Shape::kv_bytes() const {
    double keys = double(batch) * seq_k;
    if (api == Api::varlen) {
        keys = 0;
        for (const int n : varlen_lengths(*this))
            keys += n;
    }
    return keys * heads_kv * (d_head + v_head_dim()) * 2.0;  // K and V, 2 bytes an element
}

Measurement Measurement::of(std::string label, const KernelChoice& kernel, const Shape& shape,
                            std::vector<double> times_ms) {
    std::vector<double> t = times_ms;
    std::sort(t.begin(), t.end());
    const std::size_t n = t.size();
    const double median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    return {std::move(label),   kernel, shape, median, t.front(), t.back(), static_cast<int>(n),
            std::move(times_ms)};
}

double harmonic_mean_tflops(const std::vector<Measurement>& measurements) {
    if (measurements.empty())
        return 0;
    double inverse = 0;
    for (const Measurement& m : measurements)
        inverse += 1.0 / m.tflops();
    return measurements.size() / inverse;
}

namespace {

// snprintf into a string of the length it needs (a polyline of many points is long).
std::string printf_string(const char* format, auto... args) {
    const int length = std::snprintf(nullptr, 0, format, args...);
    if (length <= 0)
        return {};
    std::string text(static_cast<std::size_t>(length), '\0');
    std::snprintf(text.data(), text.size() + 1, format, args...);
    return text;
}

// Labels in first-seen order, each with its measurements.
std::vector<std::pair<std::string, std::vector<Measurement>>> group(
    const std::vector<Measurement>& results) {
    std::vector<std::pair<std::string, std::vector<Measurement>>> groups;
    for (const Measurement& m : results) {
        auto it = std::find_if(groups.begin(), groups.end(),
                               [&](const auto& g) { return g.first == m.label; });
        if (it == groups.end()) {
            groups.push_back({m.label, {}});
            it = groups.end() - 1;
        }
        it->second.push_back(m);
    }
    return groups;
}

std::string csv_field(const std::string& s) {
    return "\"" + s + "\"";
}

std::string xml_escaped(const std::string& s) {
    std::string out;
    for (const char c : s) {
        if (c == '&')
            out += "&amp;";
        else if (c == '<')
            out += "&lt;";
        else if (c == '>')
            out += "&gt;";
        else
            out += c;
    }
    return out;
}

}  // namespace

std::string format_report(const std::vector<Measurement>& results, const std::string& format,
                          const std::string& device) {
    const auto groups = group(results);
    if (format == "json") {
        nlohmann::json j;
        j["device"] = device;
        j["measurements"] = nlohmann::json::array();
        for (const Measurement& m : results) {
            j["measurements"].push_back({{"config", m.label},
                                         {"kernel", m.kernel.to_string()},
                                         {"api", api_name(m.shape)},
                                         {"dtype", to_string(m.shape.dtype)},
                                         {"d_head", m.shape.d_head},
                                         {"batch", m.shape.batch},
                                         {"heads", m.shape.heads},
                                         {"heads_kv", m.shape.heads_kv},
                                         {"causal", m.shape.causal},
                                         {"seq_q", m.shape.seq_q},
                                         {"seq_k", m.shape.seq_k},
                                         {"median_ms", m.median_ms},
                                         {"min_ms", m.min_ms},
                                         {"max_ms", m.max_ms},
                                         {"runs", m.runs},
                                         {"times_ms", m.times_ms},
                                         {"tflops", m.tflops()},
                                         {"kv_tbps", m.kv_tbps()}});
        }
        j["harmonic_mean_tflops"] = nlohmann::json::object();
        for (const auto& [label, ms] : groups)
            j["harmonic_mean_tflops"][label] = harmonic_mean_tflops(ms);
        return j.dump(2) + "\n";
    }
    std::string out;
    if (format == "csv") {
        out =
            "config,kernel,api,dtype,d_head,batch,heads,heads_kv,seq_q,seq_k,causal,median_ms,"
            "min_ms,max_ms,runs,tflops,kv_tbps\n";
        for (const Measurement& m : results) {
            out += csv_field(m.label) + "," + csv_field(m.kernel.to_string()) + "," +
                   api_name(m.shape) + "," + std::string(to_string(m.shape.dtype)) +
                   printf_string(",%d,%d,%d,%d,%d,%d,%d,%.5f,%.5f,%.5f,%d,%.2f,%.4f\n",
                                 m.shape.d_head, m.shape.batch, m.shape.heads, m.shape.heads_kv,
                                 m.shape.seq_q, m.shape.seq_k, int(m.shape.causal), m.median_ms,
                                 m.min_ms, m.max_ms, m.runs, m.tflops(), m.kv_tbps());
        }
        return out;
    }
    std::size_t width = 6;
    for (const Measurement& m : results)
        width = std::max(width, m.label.size());
    const int w = static_cast<int>(width);
    out += "# device: " + device + "\n";
    // K/V TB/s: the bytes of K and V over the time, the measure of a decoding kernel (a
    // dense kernel reads them once per query tile, so the column is for the serving rows).
    // TFLOP/s stays the last column, which scripts read.
    out += printf_string("%-*s %5s %5s %5s %7s %11s %6s %10s %8s %9s %8s\n", w, "config", "dtype",
                         "d", "batch", "heads", "seq", "causal", "median_ms", "spread", "K/V TB/s",
                         "TFLOP/s");
    for (const Measurement& m : results) {
        const std::string heads =
            m.shape.heads_kv == m.shape.heads
                ? std::to_string(m.shape.heads)
                : std::to_string(m.shape.heads) + "/" + std::to_string(m.shape.heads_kv);
        std::string seq = m.shape.seq_k == m.shape.seq_q
                              ? std::to_string(m.shape.seq_q)
                              : std::to_string(m.shape.seq_q) + "x" + std::to_string(m.shape.seq_k);
        if (m.shape.api == Api::varlen)
            seq = "1.." + seq;
        const std::string tbps =
            m.shape.api == Api::dense ? "-" : printf_string("%.2f", m.kv_tbps());
        out += printf_string("%-*s %5s %5d %5d %7s %11s %6s %10.4f %7.1f%% %9s %8.1f\n", w,
                             m.label.c_str(), std::string(to_string(m.shape.dtype)).c_str(),
                             m.shape.d_head, m.shape.batch, heads.c_str(), seq.c_str(),
                             m.shape.causal ? "yes" : "no", m.median_ms, 100 * m.spread(),
                             tbps.c_str(), m.tflops());
    }
    out += printf_string("\n%-*s %8s\n", w, "harmonic mean over sequence lengths", "TFLOP/s");
    for (const auto& [label, ms] : groups) {
        out += printf_string("%-*s %8.1f\n", w, label.c_str(), harmonic_mean_tflops(ms));
    }
    return out;
}

std::string svg_chart(const std::vector<Measurement>& results, const std::string& title) {
    constexpr double width = 900, height = 520, left = 70, right = 30, top = 50, bottom = 60;
    const auto groups = group(results);
    int seq_min = 1 << 30, seq_max = 1;
    double rate_max = 1;
    for (const Measurement& m : results) {
        seq_min = std::min(seq_min, m.shape.seq_q);
        seq_max = std::max(seq_max, m.shape.seq_q);
        rate_max = std::max(rate_max, m.tflops());
    }
    rate_max = std::ceil(rate_max / 100) * 100;
    const double lx0 = std::log2(seq_min), lx1 = std::max(std::log2(seq_max), lx0 + 1);
    const auto x = [&](int seq) {
        return left + (std::log2(seq) - lx0) / (lx1 - lx0) * (width - left - right);
    };
    const auto y = [&](double r) {
        return height - bottom - r / rate_max * (height - top - bottom);
    };
    static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    std::string s = printf_string(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
        "fill=\"white\"/>\n",
        width, height + 20.0 * groups.size());
    s += printf_string(
        "<text x=\"%.0f\" y=\"25\" font-size=\"15\" text-anchor=\"middle\">%s</text>\n", width / 2,
        xml_escaped(title).c_str());
    for (double r = 0; r <= rate_max; r += rate_max / 5) {
        s += printf_string(
            "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n",
            left, width - right, y(r), y(r), left - 6, y(r) + 4, r);
    }
    for (long long seq = seq_min; seq <= seq_max; seq *= 2) {
        s += printf_string("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%lld</text>\n",
                           x(static_cast<int>(seq)), height - bottom + 18, seq);
    }
    s +=
        printf_string("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">sequence length</text>\n",
                      (left + width - right) / 2, height - bottom + 40);
    s += printf_string(
        "<text x=\"18\" y=\"%.1f\" transform=\"rotate(-90 18 %.1f)\" "
        "text-anchor=\"middle\">TFLOP/s</text>\n",
        (top + height - bottom) / 2, (top + height - bottom) / 2);
    for (std::size_t g = 0; g < groups.size(); ++g) {
        auto ms = groups[g].second;
        std::sort(ms.begin(), ms.end(),
                  [](const auto& a, const auto& b) { return a.shape.seq_q < b.shape.seq_q; });
        std::string points;
        for (const Measurement& m : ms)
            points += printf_string("%.1f,%.1f ", x(m.shape.seq_q), y(m.tflops()));
        const char* color = colors[g % std::size(colors)];
        s += printf_string(
            "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", color,
            points.c_str());
        for (const Measurement& m : ms) {
            s += printf_string("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                               x(m.shape.seq_q), y(m.tflops()), color);
        }
        const double ly = height + 20.0 * g - 5;
        s += printf_string(
            "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
            "stroke-width=\"3\"/>"
            "<text x=\"%.0f\" y=\"%.1f\">%s</text>\n",
            left, left + 25, ly - 4, ly - 4, color, left + 32, ly,
            xml_escaped(groups[g].first).c_str());
    }
    return s + "</svg>\n";
}

}  // namespace flash_attention::cli
