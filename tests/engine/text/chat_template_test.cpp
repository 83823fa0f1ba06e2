// The chat_template facade: the variables it passes (as transformers.js's apply_chat_template does),
// template selection from tokenizer_config.json, and every error class, limits included. A red test
// names the contract that broke: a missing variable, a wrong template chosen, an error of the wrong
// class, or a runaway template that was not stopped.
#include "engine/text/chat_template.hpp"

#include <gtest/gtest.h>

#include <string>

namespace troupe::text {
namespace {

chat_render_options fixed_options() {
  chat_render_options o;
  o.date = jinja::calendar_time{2024, 7, 26, 14, 5};
  return o;
}

std::string render_ok(std::string_view source, std::string_view messages = "[]",
                      const chat_render_options& options = fixed_options()) {
  auto t = chat_template::parse(source);
  if (!t) return "parse error: " + t.error().describe();
  auto r = t->render(messages, options);
  return r ? *r : "error: " + r.error().describe();
}

template_error render_error(std::string_view source, std::string_view messages = "[]",
                            const chat_render_options& options = fixed_options()) {
  auto t = chat_template::parse(source);
  if (!t) return t.error();
  auto r = t->render(messages, options);
  EXPECT_FALSE(r.has_value()) << "rendered: " << *r;
  return r ? template_error{} : r.error();
}

constexpr std::string_view chatml =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST(chat_template, renders_messages_and_the_generation_prompt) {
  const std::string messages = R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])";
  EXPECT_EQ(render_ok(chatml, messages), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n");
  auto options = fixed_options();
  options.add_generation_prompt = true;
  EXPECT_EQ(render_ok(chatml, R"([{"role": "user", "content": "Hi"}])", options),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(chat_template, passes_the_variables_transformers_passes) {
  // tools and documents are none when not given; unset special tokens stay undefined.
  EXPECT_EQ(render_ok("{{ tools is none }} {{ documents is none }} {{ bos_token is defined }} {{ add_generation_prompt }}"),
            "true true false false");
  auto options = fixed_options();
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
  options.extra_json = R"({"enable_thinking": false, "eos_token": "<eot>"})";
  EXPECT_EQ(render_ok("{{ bos_token }}{{ tools[0].function.name }} {{ enable_thinking }} {{ eos_token }}", "[]", options),
            "<s>f false <eot>");
  // An empty special token is not passed at all, as apply_chat_template skips falsy tokens.
  options.bos_token = "";
  EXPECT_EQ(render_ok("{{ bos_token is defined }}", "[]", options), "false");
}

TEST(chat_template, strftime_now_prints_the_given_date) {
  EXPECT_EQ(render_ok("{{ strftime_now('%d %b %Y') }}"), "26 Jul 2024");
}

TEST(chat_template, is_parsed_once_and_rendered_many_times) {
  auto t = chat_template::parse(chatml);
  ASSERT_TRUE(t.has_value());
  const chat_template copy = *t;
  for (int i = 0; i < 3; ++i) {
    auto r = copy.render(R"([{"role": "user", "content": ")" + std::to_string(i) + "\"}]", fixed_options());
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(*r, "<|im_start|>user\n" + std::to_string(i) + "<|im_end|>\n");
  }
}

TEST(chat_template, raise_exception_carries_the_templates_message) {
  const auto e = render_error(
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('Unsupported role: ' ~ m.role) }}{% endif %}{% endfor %}",
      R"([{"role": "robot", "content": ""}])");
  EXPECT_EQ(e.code, template_error_code::raise_exception);
  EXPECT_EQ(e.message, "Unsupported role: robot");
  EXPECT_EQ(e.line, 1u);
}

TEST(chat_template, syntax_errors_say_where) {
  auto t = chat_template::parse("Hello\n  {{ name + }}");
  ASSERT_FALSE(t.has_value());
  EXPECT_EQ(t.error().code, template_error_code::syntax_error);
  EXPECT_EQ(t.error().line, 2u);
  EXPECT_EQ(t.error().column, 13u);
  EXPECT_EQ(t.error().describe(), "2:13: unexpected '}}' (syntax_error)");

  EXPECT_EQ(chat_template::parse("{% if x %}never closed").error().code, template_error_code::syntax_error);
  EXPECT_EQ(chat_template::parse("{% frobnicate %}").error().code, template_error_code::syntax_error);
  EXPECT_EQ(chat_template::parse("{{ 'unterminated }}").error().code, template_error_code::syntax_error);
  EXPECT_EQ(chat_template::parse("{# unterminated").error().code, template_error_code::syntax_error);
  EXPECT_EQ(chat_template::parse("{% macro f(a=1, b) %}{% endmacro %}").error().code, template_error_code::syntax_error);
}

TEST(chat_template, unknown_filters_and_tests_fail_when_reached) {
  EXPECT_EQ(render_error("{{ 'x'|shout }}").code, template_error_code::unknown_filter);
  EXPECT_EQ(render_error("{{ 'x' is shiny }}").code, template_error_code::unknown_test);
  // As in the reference, a branch that never runs is not checked.
  EXPECT_EQ(render_ok("{% if false %}{{ 'x'|shout }}{% endif %}ok"), "ok");
}

TEST(chat_template, type_errors_and_undefined_calls) {
  EXPECT_EQ(render_error("{{ 1 - 'a' }}").code, template_error_code::type_error);
  EXPECT_EQ(render_error("{{ missing + 1 }}").code, template_error_code::type_error);
  EXPECT_EQ(render_error("{{ none ~ 'x' }}").code, template_error_code::type_error);
  EXPECT_EQ(render_error("{% for x in 5 %}{% endfor %}").code, template_error_code::type_error);
  EXPECT_EQ(render_error("{{ 'abc'|length|upper }}").code, template_error_code::type_error);
  EXPECT_EQ(render_error("{% break %}").code, template_error_code::type_error);
  const auto e = render_error("{{ missing() }}");
  EXPECT_EQ(e.code, template_error_code::undefined_call);
  EXPECT_EQ(e.message, "'missing' is undefined");
  EXPECT_EQ(render_error("{{ 'abc'.shout() }}").code, template_error_code::undefined_call);
}

TEST(chat_template, refuses_unusable_input) {
  EXPECT_EQ(render_error(chatml, "not json").code, template_error_code::invalid_input);
  EXPECT_EQ(render_error(chatml, R"({"role": "user"})").code, template_error_code::invalid_input);
  auto options = fixed_options();
  options.extra_json = "[1]";
  EXPECT_EQ(render_error(chatml, "[]", options).code, template_error_code::invalid_input);
  // The reference refuses to redeclare its globals.
  options.extra_json = R"({"range": 1})";
  EXPECT_EQ(render_error(chatml, "[]", options).code, template_error_code::invalid_input);
}

TEST(chat_template, output_limit_stops_runaway_text) {
  auto options = fixed_options();
  options.limits.max_output_bytes = 500;
  EXPECT_EQ(render_error("{% for i in range(100) %}0123456789{% endfor %}", "[]", options).code,
            template_error_code::output_limit);
  // A string that doubles on every iteration is stopped before it is built.
  EXPECT_EQ(render_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                         "{% endfor %}",
                         "[]", options)
                .code,
            template_error_code::output_limit);
}

TEST(chat_template, loop_limit_counts_every_iteration) {
  auto options = fixed_options();
  options.limits.max_loop_iterations = 50;
  EXPECT_EQ(render_error("{% for i in range(10) %}{% for j in range(10) %}{% endfor %}{% endfor %}", "[]", options).code,
            template_error_code::loop_limit);
  EXPECT_EQ(render_error("{{ range(1000000000000) }}").code, template_error_code::loop_limit);
  EXPECT_EQ(render_error("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
                         "{% endfor %}")
                .code,
            template_error_code::loop_limit);
}

TEST(chat_template, recursion_limit_stops_runaway_recursion) {
  EXPECT_EQ(render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").code, template_error_code::recursion_limit);
  // Values that nest without end: a list wrapped again each iteration, a namespace holding itself.
  EXPECT_EQ(render_error("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
                         "{% endfor %}")
                .code,
            template_error_code::recursion_limit);
  EXPECT_EQ(render_error("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns|tojson }}").code,
            template_error_code::recursion_limit);
}

TEST(chat_template_config, reads_a_single_template_and_special_tokens) {
  auto c = chat_template_from_config(
      R"({"chat_template": "{{ bos_token }}", "bos_token": "<s>",
          "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false}})",
      false);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->source, "{{ bos_token }}");
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_EQ(c->eos_token, "</s>");
}

TEST(chat_template_config, picks_among_named_templates_as_transformers_does) {
  const std::string config = R"({"chat_template": [{"name": "default", "template": "D"},
                                                   {"name": "tool_use", "template": "T"},
                                                   {"name": "rag", "template": "R"}]})";
  EXPECT_EQ(chat_template_from_config(config, false)->source, "D");
  EXPECT_EQ(chat_template_from_config(config, true)->source, "T");
  EXPECT_EQ(chat_template_from_config(config, true, "rag")->source, "R");
  EXPECT_EQ(chat_template_from_config(config, false, "nope").error().code, template_error_code::invalid_input);
  EXPECT_FALSE(chat_template_from_config(R"({"chat_template": [{"name": "x", "template": "X"}]})", false).has_value());
}

TEST(chat_template_config, a_config_without_a_template_gives_an_empty_source) {
  auto c = chat_template_from_config(R"({"bos_token": "<s>"})", false);
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->source.empty());
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_FALSE(c->eos_token.has_value());
  EXPECT_EQ(chat_template_from_config("{", false).error().code, template_error_code::invalid_input);
}

}  // namespace
}  // namespace troupe::text
