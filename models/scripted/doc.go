// Package scripted is a deterministic models.Provider for demos, tests and
// the offline eval. It never pretends to be a language model: its Name, and
// every Response's Provider, is "scripted".
//
// A [Provider] holds an ordered list of [Rule]s, usually loaded from JSON
// with [ParseRules]:
//
//	[{"match": "(?i)metformin", "when_no_tool_result": true,
//	  "tool_calls": [{"name": "kb_search", "arguments": {"query": "{{input}}"}}]},
//	 {"match": "(?i)metformin", "tool_result": "^refused: ",
//	  "respond": "I could not search the guide: {{context}}"},
//	 {"match": "(?i)metformin", "when_tool_result": true,
//	  "respond": "Here is what I found: {{context}}"}]
//
// The first rule whose pattern matches the last user message (and whose
// tool-result conditions hold: when_tool_result, when_no_tool_result, or a
// tool_result pattern the turn's tool results must match) answers; when none does, the fallback answer
// [FallbackAnswer] says so plainly. Templates may use {{input}} (the last
// user message), {{context}} (the tool results of this turn, or else the last
// system message starting with [ContextPrefix]), {{match}} and {{1}}..{{9}}
// (the pattern's match and groups). A rule can also script a failure
// ("fail": "timeout"), so retry paths can be tested without a flaky server.
//
// Answers stream in a few chunks and report approximate token counts (words).
// A request's answer cap (Options.MaxOutputTokens) is honoured as a model
// server honours it: an answer longer than the cap, by the rule models
// estimates tokens with (models.EstimateTokens), streams cut to it and
// fails as an *models.Error of kind Truncated, with what it spent, as
// Ollama's done_reason "length" does.
package scripted
