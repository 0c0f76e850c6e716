// Package wiring connects packages that may not import each other: it
// adapts the bbolt store to the interfaces the agent package consumes
// (CallLog), and moves an appliance's model calls to an Ollama that came
// up after it started (OllamaSwitch).
package wiring
