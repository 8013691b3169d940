// Package trace reads, writes, generates and replays request traces in the
// format of Mooncake's public traces (kvcache-ai/Mooncake, FAST'25): JSON
// lines of
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}
//
// where timestamp is the arrival in milliseconds from the start of the
// trace, input_length and output_length are token counts, and hash_ids
// names each block of BlockTokens (512) prompt tokens: two requests whose
// hash_ids start alike share that prefix.
//
// Parse treats the file as hostile: every line, count and length is
// bounded before it sizes anything, and errors name the line. A Replay
// turns the records into /v1/completions requests whose prompts are made of
// one deterministic text block per hash id, so equal hash-id prefixes are
// byte-equal prompt prefixes (and share KV blocks on gpusim or a real
// engine), and sends them at the trace's times, compressed and windowed;
// it implements loadtest's Scheduled. Generate writes a synthetic trace of
// multi-turn conversations and shared documents behind one system prompt.
package trace
