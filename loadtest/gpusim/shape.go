package gpusim

import (
	"errors"
	"fmt"
)

// ErrUnknownPath is returned by PromptBlocks for a path gpusim does not
// generate on.
var ErrUnknownPath = errors.New("gpusim: not a generation path")

// PromptBlocks returns what an instance with bytesPerToken and blockSize
// (Config.BytesPerToken, Config.BlockSize) would look up in its KV cache
// for a request to path with body: the chained hashes of the prompt's full
// blocks, in order, and the prompt's length in tokens. The prompt is
// rendered and hashed exactly as the instance does (chat messages through
// its chat template, completion prompts as text or token ids, the chain
// salted by cache_salt), so two requests share a cached prefix on an
// instance exactly as far as their hashes agree. path is
// /v1/chat/completions, /v1/completions, /invocations or /v1/responses
// (instructions and input rendered as chat messages); a body the instance
// would reject gives its error.
//
// A request hits at most (tokens-1)/blockSize blocks, as the last prompt
// token is always computed; the instance counts tokens as queried and the
// hit blocks times blockSize as hit (vllm:prefix_cache_queries_total and
// vllm:prefix_cache_hits_total). The blocks are the base model's: a
// request for a LoRA adapter hashes its blocks under the adapter's name,
// so it shares none with them.
func PromptBlocks(path string, body []byte, bytesPerToken, blockSize int) ([]uint64, int, error) {
	if bytesPerToken < 1 || blockSize < 1 {
		return nil, 0, fmt.Errorf("%w: bytes per token %d and block size %d must be >= 1", ErrInvalidConfig, bytesPerToken, blockSize)
	}
	var ep endpoint
	switch path {
	case "/v1/chat/completions":
		ep = endpointChat
	case "/v1/completions":
		ep = endpointCompletion
	case "/invocations":
		ep = endpointInvocations
	case "/v1/responses":
		ep = endpointResponses
	default:
		return nil, 0, fmt.Errorf("%w: %q", ErrUnknownPath, path)
	}
	p, aerr := parseRequest(body, ep, bytesPerToken, nil)
	if aerr != nil {
		return nil, 0, aerr
	}
	s := shapePrompt(p.text, p.unit, blockSize, p.salt, "")
	return s.hashes, s.tokens, nil
}
