package relay

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
)

// encode frames data as chunks of the given sizes (the rest in one), with
// an extension on every other size line and the given trailer lines.
func encode(data []byte, sizes []int, trailers []string) []byte {
	var b []byte
	for i := 0; len(data) > 0; i++ {
		n := len(data)
		if i < len(sizes) && sizes[i] > 0 && sizes[i] < n {
			n = sizes[i]
		}
		b = append(b, strconv.FormatInt(int64(n), 16)...)
		if i%2 == 1 {
			b = append(b, ";ext=v"...)
		}
		b = append(b, "\r\n"...)
		b = append(b, data[:n]...)
		b = append(b, "\r\n"...)
		data = data[n:]
	}
	b = append(b, "0\r\n"...)
	for _, t := range trailers {
		b = append(b, t+"\r\n"...)
	}
	return append(b, "\r\n"...)
}

// feedSplit feeds p to a new decoder in pieces cut at cuts.
func feedSplit(p []byte, cuts []int) ([]byte, int, error, bool) {
	var d Decoder
	var out []byte
	used := 0
	prev := 0
	for _, c := range append(cuts, len(p)) {
		if c < prev || c > len(p) {
			continue
		}
		var n int
		var err error
		out, n, err = d.Feed(out, p[prev:c])
		used += n
		if err != nil || d.Done() {
			return out, used, err, d.Done()
		}
		prev = c
	}
	return out, used, nil, d.Done()
}

func TestDecoderRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		data := make([]byte, rng.IntN(3000))
		for j := range data {
			data[j] = byte(rng.IntN(256))
		}
		sizes := []int{1 + rng.IntN(300), 1 + rng.IntN(5), 1 + rng.IntN(2000)}
		var tr []string
		if i%3 == 0 {
			tr = []string{"X-Trailer: v", "Y: w"}
		}
		enc := encode(data, sizes, tr)
		enc = append(enc, "HTTP/1.1 200 OK\r\n"...) // a next response
		var cuts []int
		for c := 0; c < len(enc); c += 1 + rng.IntN(40) {
			cuts = append(cuts, c)
		}
		out, used, err, done := feedSplit(enc, cuts)
		if err != nil || !done || !bytes.Equal(out, data) || used != len(enc)-len("HTTP/1.1 200 OK\r\n") {
			t.Fatalf("case %d: err %v done %v used %d of %d, body equal %v", i, err, done, used, len(enc), bytes.Equal(out, data))
		}
	}
}

func TestDecoderRejects(t *testing.T) {
	long := bytes.Repeat([]byte("a"), maxLine+1)
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"\r\n", ErrChunkSize},
		{"g\r\n", ErrChunkSize},
		{"-1\r\n", ErrChunkSize},
		{"1000000000000000\r\n", ErrChunkSize},
		{"5\nhello\r\n", ErrChunkSize},
		{"5\r\nhelloX\r\n", ErrChunkEnd},
		{"5\r\nhello\rX", ErrChunkEnd},
		{"5;" + string(long) + "\r\n", ErrChunkLine},
		{"5;a\x01b\r\n", ErrChunkLine},
		{"0\r\nX: " + string(long) + "\r\n\r\n", ErrChunkLine},
		{"0\r\nX: \x00\r\n\r\n", ErrChunkLine},
		{"0\r\n\rX", ErrChunkEnd},
		{"0\r\n" + string(bytes.Repeat([]byte("X: yyyyyyyyyyyyyyyyyyyyyyyyyyyyy\r\n"), 600)) + "\r\n", ErrTrailers},
	} {
		_, _, err, _ := feedSplit([]byte(tc.in), nil)
		if !errors.Is(err, tc.want) {
			t.Errorf("%q: err %v, want %v", tc.in[:min(len(tc.in), 40)], err, tc.want)
		}
	}
}

func TestAppendChunk(t *testing.T) {
	for _, n := range []int{0, 1, 15, 16, 255, 4096, 70000} {
		data := bytes.Repeat([]byte("z"), n)
		got := appendChunk(nil, data)
		want := strconv.FormatInt(int64(n), 16) + "\r\n" + string(data) + "\r\n"
		if string(got) != want {
			t.Fatalf("n=%d: framing %q", n, got[:min(len(got), 10)])
		}
	}
}

// FuzzDecoder: any input gives the same body, consumption and error
// whether fed whole or in pieces, never more body than input, and an
// encoding of the body decodes back to it.
func FuzzDecoder(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), uint16(3))
	f.Add([]byte("3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\nextra"), uint16(7))
	f.Add([]byte("ffffffffffffffff\r\n"), uint16(1))
	f.Add([]byte("0\r\n\r"), uint16(2))
	f.Fuzz(func(t *testing.T, p []byte, step uint16) {
		whole, usedW, errW, doneW := feedSplit(p, nil)
		var cuts []int
		s := int(step%64) + 1
		for c := s; c < len(p); c += s {
			cuts = append(cuts, c)
		}
		split, usedS, errS, doneS := feedSplit(p, cuts)
		if !bytes.Equal(whole, split) || usedW != usedS || !errors.Is(errS, errW) || doneW != doneS {
			t.Fatalf("whole (%d body, used %d, %v, done %v) != split (%d body, used %d, %v, done %v)",
				len(whole), usedW, errW, doneW, len(split), usedS, errS, doneS)
		}
		if len(whole) > len(p) || usedW > len(p) {
			t.Fatalf("body %d or used %d over input %d", len(whole), usedW, len(p))
		}
		enc := encode(whole, []int{int(step%97) + 1}, nil)
		back, used, err, done := feedSplit(enc, nil)
		if err != nil || !done || used != len(enc) || !bytes.Equal(back, whole) {
			t.Fatalf("re-encoded body did not decode back: %v done %v", err, done)
		}
	})
}
