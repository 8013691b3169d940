package gpusim

// fillerText is the output vocabulary: plain ASCII (no JSON escaping
// needed), about 4-5 bytes per token with the leading space, like English
// text under a BPE tokenizer.
const fillerText = "the of and to in is that it for as with was on be by at this are from " +
	"or an have not but they which one you all were we can her has there been if more " +
	"when will would who so no out up said what its about than into them only some time " +
	"could new two may then do first any like my now over"

// filler is the deterministic output text: token i of a request whose
// prompt seed is s is word (s + (i+1)*golden) >> 58, so the same prompt
// always gets the same answer and producing a token costs a multiply and a
// shift.
type filler struct {
	words  [64]string // first token: no leading space
	spaced [64]string // later tokens: " word"
}

func newFiller() *filler {
	f := &filler{}
	n, start := 0, 0
	for i := 0; i <= len(fillerText) && n < 64; i++ {
		if i == len(fillerText) || fillerText[i] == ' ' {
			if i > start {
				f.words[n] = fillerText[start:i]
				f.spaced[n] = " " + f.words[n]
				n++
			}
			start = i + 1
		}
	}
	for ; n < 64; n++ { // fewer than 64 words: wrap around
		f.words[n], f.spaced[n] = f.words[n%8], f.spaced[n%8]
	}
	return f
}

// token returns the text of token i (0-based) for a prompt with seed s.
func (f *filler) token(seed uint64, i int) string {
	k := (seed + uint64(i+1)*0x9e3779b97f4a7c15) >> 58
	if i == 0 {
		return f.words[k]
	}
	return f.spaced[k]
}
