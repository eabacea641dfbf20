#pragma once

// Turns a named kernel set into the translation units that instantiate its kernels
// and the registry table that maps each config to its launcher.

#include <map>
#include <string>
#include <string_view>

namespace flash_attention::generator {

// File name -> contents: kernels_000.cu .. kernels_{shards-1}.cu for the sm80 family,
// kernels_sm90_000.cu .. kernels_sm90_{sm90_shards-1}.cu for the sm90 family (compiled
// for sm_90a only), and registry_table.cpp. sm90_shards = 0 leaves the sm90 family out
// (a build without an sm_90 target). Configs are dealt round-robin so every shard
// compiles in about the same time. Deterministic: the same arguments always give the
// same bytes.
std::map<std::string, std::string> generate(std::string_view set_name, int shards,
                                            int sm90_shards = 0);

}  // namespace flash_attention::generator
