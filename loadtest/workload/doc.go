// Package workload generates the request streams of a load test: the
// prompt-reuse patterns that prefix-aware routing is meant for (retrieval-
// augmented generation, multi-turn chat, templated bots, code completion),
// patterns it was not designed on (many system prompts of skewed
// popularity, one preamble longer than a routing key in front of every
// request, agentic sessions whose histories grow by tool calls and
// results), a no-reuse control and a weighted mix of them.
//
// A Generator is a deterministic sequence: the same Config (seed included)
// always yields the same requests in the same order, byte for byte, so two
// runs under different routing strategies see exactly the same traffic.
// Bodies are rendered as compact OpenAI JSON into a caller-owned buffer, so
// a load generator can reuse its buffers and send them as they are.
//
// Sizes are given in tokens. Text is built from short pseudo-words of four
// bytes on average (separator included), so a word is close to one token
// under both the whitespace and the four-bytes-per-token estimates (the
// latter is gpusim's tokenizer).
package workload
