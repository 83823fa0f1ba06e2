// Images through the vision tower and the seed's request inputs (driver.hpp: encode_image, with_images).
#include <cstring>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {

result<tensor, driver_error> driver<serving>::encode_image(const families::image_u8& image) {
  auto& st = *s_;
  const auto* tower = st.handle->vision();
  if (!tower) return unexpected(driver_error{driver_error_code::program_not_offered, "the model has no vision tower (an mmproj, or a checkpoint with one)"});
  const auto& spec = tower->spec;
  if (!st.vision_exe) {
    st.vision_weights = std::make_unique<weight_map_source>(tower->encoder->weights());
    auto exe = st.ex->load(*st.vision_weights);
    if (!exe) return unexpected(driver_error{driver_error_code::prepare_failed, "vision tower: " + exe.error().message()});
    st.vision_exe = *exe;
  }
  families::step_spec s;
  s.program = families::program::encode;
  s.shape = families::step_shape(1, spec.patches(), spec.patches());
  s.carried_inputs = {families::pixels_input};
  if (!st.vision_entry) {
    auto g = tower->encoder->trace(s, st.options.limits);
    if (!g) return unexpected(driver_error{driver_error_code::prepare_failed, "trace of the vision tower: " + g.error().message()});
    auto e = st.ex->add_entry(*st.vision_exe, *g);
    if (!e) return unexpected(driver_error{driver_error_code::prepare_failed, "vision tower: " + e.error().message()});
    st.vision_entry = *e;
  }
  const auto pixels = families::preprocess(image, spec);
  exec::step_inputs in;
  in.slots[families::pixels_input] = pixels.view();
  auto out = st.ex->step(*st.vision_entry, in);
  if (!out) return unexpected(driver_error{driver_error_code::step_failed, "vision tower: " + out.error().message()});
  auto it = out->outputs.find("embeds");
  if (it == out->outputs.end()) return unexpected(driver_error{driver_error_code::step_failed, "the vision tower gave no embeds"});
  return std::move(it->second);
}

result<seq_request, driver_error> driver<serving>::with_images(seq_request req, std::span<const families::image_u8> images) {
  auto& st = *s_;
  auto bad = [](std::string why) { return unexpected(driver_error{driver_error_code::bad_request, std::move(why)}); };
  const auto* tower = st.handle->vision();
  if (!tower) return unexpected(driver_error{driver_error_code::program_not_offered, "the model has no vision tower (an mmproj, or a checkpoint with one)"});
  const auto* codec = st.handle->text();
  const auto& spec = tower->spec;
  auto single = [&](const std::string& text) -> std::optional<std::int32_t> {
    if (!codec) return std::nullopt;
    auto ids = codec->encode(text, false);
    if (!ids || ids->size() != 1) return std::nullopt;
    return (*ids)[0];
  };
  const auto begin = spec.begin_id >= 0 ? std::optional<std::int32_t>(spec.begin_id) : single(spec.begin_text);
  const auto end = spec.end_id >= 0 ? std::optional<std::int32_t>(spec.end_id) : single(spec.end_text);
  if (!begin || !end) return bad("the tokenizer has no single token for " + spec.begin_text + " or " + spec.end_text);
  const auto& schema = st.handle->model().schema();
  if (!schema.find_input("embeds") || !schema.find_input("embed_mask") || (spec.bidirectional && !schema.find_input("attend_until")))
    return bad("the text model takes no embedding rows");
  std::size_t marks = 0;
  for (auto t : req.prompt) marks += t == *begin;
  if (marks == 0 && images.empty()) return req;
  if (!req.inputs.empty()) return bad("a request with images takes no other request inputs");
  if (marks != images.size())
    return bad("the prompt marks " + std::to_string(marks) + " images with " + spec.begin_text + "; " + std::to_string(images.size()) + " were given");
  const std::int64_t N = spec.tokens(), H = spec.text_hidden;
  std::vector<tensor> rows;
  for (const auto& img : images) {
    auto e = encode_image(img);
    if (!e) return unexpected(e.error());
    if (e->type() != dtype::f32 || e->shape().rank() != 2 || e->shape()[0] != N || e->shape()[1] != H)
      return unexpected(driver_error{driver_error_code::step_failed, "the vision tower's rows are " + e->shape().str()});
    rows.push_back(std::move(*e));
  }
  std::vector<std::int32_t> prompt;
  std::vector<std::int64_t> positions;
  for (auto t : req.prompt) {
    prompt.push_back(t);
    if (t != *begin) continue;
    for (std::int64_t i = 0; i < N; ++i) {
      positions.push_back(static_cast<std::int64_t>(prompt.size()));
      prompt.push_back(*begin);  // the id under an image row (its embedding replaces the token's)
    }
    prompt.push_back(*end);
  }
  const auto n = static_cast<std::int64_t>(positions.size());
  request_input_value embeds{tensor(dtype::f32, {n, H}), positions}, mask{tensor(dtype::i32, {n, 1}), positions},
      until{tensor(dtype::i32, {n, 1}), positions};
  for (std::size_t k = 0; k < rows.size(); ++k) {
    std::memcpy(embeds.values.as<float>() + static_cast<std::int64_t>(k) * N * H, rows[k].as<float>(), static_cast<std::size_t>(N * H) * sizeof(float));
    for (std::int64_t i = 0; i < N; ++i) {
      const auto j = static_cast<std::int64_t>(k) * N + i;
      mask.values.as<std::int32_t>()[j] = 1;
      until.values.as<std::int32_t>()[j] = static_cast<std::int32_t>(positions[static_cast<std::size_t>(static_cast<std::int64_t>(k) * N + N - 1)]);
    }
  }
  req.prompt = std::move(prompt);
  req.inputs["embeds"] = std::move(embeds);
  req.inputs["embed_mask"] = std::move(mask);
  if (spec.bidirectional) req.inputs["attend_until"] = std::move(until);
  return req;
}

}  // namespace troupe::driver
