#pragma once

// The library's side of the tuning cache (its file format and writers are the tools API's,
// flash_attention/tools.hpp): the process-wide copy the automatic choice reads.

#include <optional>

#include "flash_attention/tools.hpp"

namespace flash_attention::tuning {

// The process-wide cache behind the automatic choice of forward() and backward(): read from
// default_path() on first use (a warning on stderr if it is corrupt), then kept in memory. The
// config of a key of either pass (Key::of, Key::of_backward).
std::optional<KernelConfig> lookup(const Key& key);
// The same for a split-count key (Key::of_splits).
std::optional<int> lookup_splits(const Key& key);
// Drops the in-memory copy; the next lookup reads the file again.
void reload();

}  // namespace flash_attention::tuning
