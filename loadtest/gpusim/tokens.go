package gpusim

import (
	"encoding/binary"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// rootHash is the parent hash of a prompt's first block (vLLM's NONE_HASH).
const rootHash uint64 = 0x9ae16a3b2f90404f

// promptShape is what the engine needs to know of a prompt: its length in
// tokens and the chained hash of each of its full blocks.
type promptShape struct {
	tokens int
	// hashes[k] = hash(hashes[k-1], content of block k) for every full
	// block k (the chain starts at rootHash, salted by cache_salt).
	hashes []uint64
	// seed picks the filler text, so the same prompt gets the same answer.
	seed uint64
}

// shapePrompt splits text into tokens of unit bytes (the last may be short)
// and hashes every full block of blockSize tokens, each on its parent's
// hash, as vLLM's hash_block_tokens(parent_hash, block_token_ids) does.
// The chain starts from a root salted by cache_salt and by the LoRA
// adapter's name, so neither a salt nor an adapter shares a block with
// another (vLLM puts both in the blocks' extra keys). An adapter also
// changes the filler text, as it changes a model's answers.
func shapePrompt(text []byte, unit, blockSize int, salt, adapter string) promptShape {
	tokens := (len(text) + unit - 1) / unit
	full := tokens / blockSize
	parent := rootHash
	if salt != "" {
		parent ^= xxhash.Sum64String(salt) * 0x9e3779b97f4a7c15
		if parent == rootHash {
			parent++
		}
	}
	var lora uint64
	if adapter != "" {
		// Tagged, so that no salt and adapter pair stands for another.
		lora = xxhash.Sum64String("\x00lora\x00" + adapter)
		parent = xxhash.Sum64String("\x00root\x00"+strconv.FormatUint(parent, 16)) ^ lora
	}
	p := promptShape{tokens: tokens, hashes: make([]uint64, full)}
	blockBytes := unit * blockSize
	var d xxhash.Digest
	for k := 0; k < full; k++ {
		lo := k * blockBytes
		hi := min(lo+blockBytes, len(text))
		d.ResetWithSeed(parent)
		_, _ = d.Write(text[lo:hi])
		parent = d.Sum64()
		p.hashes[k] = parent
	}
	p.seed = xxhash.Sum64(text) ^ lora
	return p
}

// appendTokenIDs renders token ids as 4 bytes each, so a token-id prompt is
// hashed with exactly one token per id.
func appendTokenIDs(dst []byte, ids []int64) []byte {
	for _, id := range ids {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(id))
	}
	return dst
}

// chatMessage is one element of a chat request's messages.
type chatMessage struct {
	Role    string      `json:"role"`
	Content chatContent `json:"content"`
}

// appendChat renders messages the way a Llama-3-style chat template would,
// in order, followed by the generation prompt for the assistant's turn:
//
//	<|role|>\n{content}<|eot|>\n ... <|assistant|>\n
//
// The markers stand in for the template's special tokens; at 4 bytes per
// token they cost about as many tokens (4-5 per message) as the real ones.
func appendChat(dst []byte, msgs []chatMessage) []byte {
	for i := range msgs {
		dst = append(dst, "<|"...)
		dst = append(dst, msgs[i].Role...)
		dst = append(dst, "|>\n"...)
		dst = append(dst, msgs[i].Content.text...)
		dst = append(dst, "<|eot|>\n"...)
	}
	return append(dst, "<|assistant|>\n"...)
}
