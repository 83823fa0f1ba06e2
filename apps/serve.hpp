#pragma once
#include "apps/speculation_flags.hpp"
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::app {

struct serve_options {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (printed)
  std::string api_key_file;
  int replicas = 1;
  std::int64_t max_rows = 16;
  std::int64_t capacity = 0;
  int pipeline_parallel = 1;  // stages per replica, each over a range of the layers
  std::string kv_type = "f16";  // the KV cache's element type (model::with_kv_type)
  int expert_parallel = 1;  // ranks per replica holding whole experts (sets tensor_parallel; equal to it when both are given)
  int tensor_parallel = 1;  // ranks per replica (simulated devices: executors of this process)  // 0: the model's positions, at most 2048
  int threads = 0;  // per executor; 0: one per core
  std::int64_t max_outstanding = 1024;
  speculation_flags speculation;  // every replica's draft policy
  std::string mmproj;  // a vision tower beside a GGUF --model (llama.cpp's mmproj GGUF; docs/vision.md)
  std::vector<std::string> lora_modules;  // NAME=PATH: LoRA adapters every replica loads (docs/adapters.md)
  int max_loras = 0;
  int max_lora_rank = 16;
};
int run_serve(const serve_options& o);

}  // namespace troupe::app
