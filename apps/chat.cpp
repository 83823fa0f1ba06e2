#include "apps/chat.hpp"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include "apps/default_model.hpp"
#include "engine/driver/cpu_replica.hpp"
#include "engine/driver/driver.hpp"
#include "engine/text/chat_prompt.hpp"
#include "families/model_handle.hpp"

namespace troupe::app {

int run_chat(const chat_options& o) {
  const auto model = model_or_default(o.model, "chat");
  if (!model) {
    std::fprintf(stderr, "%s\n", model.error().c_str());
    return 2;
  }
  auto h = families::model_handle::load(*model, families::registry::builtin());
  if (!h) {
    std::fprintf(stderr, "troupe chat: %s\n", families::message(h.error()).c_str());
    return 2;
  }
  const auto* codec = (*h)->text();
  if (!codec) {
    std::fprintf(stderr, "troupe chat: the model's tokenizer is needed (%s)\n", (*h)->text_problem().c_str());
    return 2;
  }
  if (codec->chat_template().empty()) {
    std::fprintf(stderr, "troupe chat: the model ships no chat template (use troupe generate)\n");
    return 2;
  }
  auto tmpl = text::chat_template::parse(codec->chat_template());
  if (!tmpl) {
    std::fprintf(stderr, "troupe chat: the chat template: %s\n", tmpl.error().message.c_str());
    return 2;
  }
  auto replica = driver::cpu_replica::make(*h, 1, 1, static_cast<int>(o.threads));
  if (!replica) {
    std::fprintf(stderr, "troupe chat: %s\n", replica.error().c_str());
    return 2;
  }
  driver::driver_options opt;
  (*replica)->attach(opt);
  const auto model_positions = (*h)->model().config().max_positions;
  std::int64_t capacity = model_positions > 0 ? std::min(o.context, model_positions) : o.context;
  opt.max_rows = 1;
  opt.block_size = 16;
  opt.capacity = std::max<std::int64_t>(16, capacity / 16 * 16);
  opt.prefill_chunk = std::min<std::int64_t>(256, opt.capacity);
  opt.token_budget = opt.prefill_chunk + 1;
  auto prepared = driver::driver<driver::unprepared>((*replica)->head(), (*replica)->head_executor(), opt).prepare();
  if (!prepared) {
    std::fprintf(stderr, "troupe chat: %s\n", prepared.error().second.message().c_str());
    return 1;
  }
  auto& drv = *prepared;
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  std::uint64_t seed = o.seed;
  if (seed == 0) seed = std::random_device{}();
  std::string system = o.system;
  nlohmann::json history = nlohmann::json::array();
  if (tty)
    std::fprintf(stderr, "troupe chat: %s (%lld positions). /system TEXT, /reset, /exit.\n", model->c_str(), static_cast<long long>(opt.capacity));
  std::string line;
  std::uint64_t turn = 0;
  while (true) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history = nlohmann::json::array();
      std::fprintf(stderr, "troupe chat: a new conversation\n");
      continue;
    }
    if (line.rfind("/system", 0) == 0) {
      system = line.size() > 8 ? line.substr(8) : std::string();
      std::fprintf(stderr, "troupe chat: system prompt %s\n", system.empty() ? "cleared" : "set");
      continue;
    }
    if (line.empty()) continue;
    history.push_back({{"role", "user"}, {"content", line}});
    nlohmann::json messages = nlohmann::json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    for (const auto& m : history) messages.push_back(m);
    auto ids = text::chat_prompt_ids(*codec, *tmpl, messages.dump());
    if (!ids) {
      std::fprintf(stderr, "troupe chat: %s\n", ids.error().c_str());
      history.erase(history.end() - 1);
      continue;
    }
    const auto room = opt.capacity - static_cast<std::int64_t>(ids->size());
    if (room < 1) {
      std::fprintf(stderr, "troupe chat: the conversation (%zu tokens) fills the context of %lld positions: /reset to start over\n",
                   ids->size(), static_cast<long long>(opt.capacity));
      history.erase(history.end() - 1);
      continue;
    }
    driver::seq_request r;
    r.prompt = std::move(*ids);
    r.max_tokens = std::min(o.max_tokens, room);
    r.sampling.temperature = static_cast<float>(o.temperature);
    r.sampling.top_p = static_cast<float>(o.top_p);
    r.sampling.seed = seed + turn++;
    std::string answer;
    const auto t0 = std::chrono::steady_clock::now();
    auto g = drv.generate(std::move(r), [&](const driver::seq_update& u) {
      if (u.text.empty()) return;
      answer += u.text;
      std::fwrite(u.text.data(), 1, u.text.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    std::fflush(stdout);
    if (!g) {
      std::fprintf(stderr, "troupe chat: %s\n", g.error().message().c_str());
      history.erase(history.end() - 1);
      continue;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (tty) std::fprintf(stderr, "[%zu tokens, %.1f tok/s, %s]\n", g->tokens.size(), s > 0 ? static_cast<double>(g->tokens.size()) / s : 0.0,
                          std::string(driver::name(g->finished)).c_str());
    history.push_back({{"role", "assistant"}, {"content", answer}});
  }
  return 0;
}

}  // namespace troupe::app
