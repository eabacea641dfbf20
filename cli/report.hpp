#pragma once

// Benchmark results as text: an aligned table, CSV or JSON, and an SVG chart of
// TFLOP/s against sequence length. Host code only.

#include <string>
#include <vector>

#include "measurement.hpp"

namespace flash_attention::cli {

// Rows in the order given; a label's rows are expected to be adjacent. Formats:
// "table" (with the harmonic mean per label), "csv" (one header line, one line per
// measurement), "json" ({"device", "measurements": [...], "harmonic_mean_tflops": {...}},
// each measurement with every run's time in the order they ran).
std::string format_report(const std::vector<Measurement>& results, const std::string& format,
                          const std::string& device);

// One polyline per label, x = sequence length (log2 axis), y = TFLOP/s.
std::string svg_chart(const std::vector<Measurement>& results, const std::string& title);

}  // namespace flash_attention::cli
