#pragma once

// Turns a named kernel set into the translation units that instantiate its kernels
// and the registry table that maps each config to its launcher.

#include <map>
#include <string>
#include <string_view>

namespace flash_attention::generator {

// File name -> contents: kernels_000.cu .. kernels_{shards-1}.cu and registry_table.cpp.
// Configs are dealt round-robin so every shard compiles in about the same time.
// Deterministic: the same set and shard count always give the same bytes.
std::map<std::string, std::string> generate(std::string_view set_name, int shards);

}  // namespace flash_attention::generator
