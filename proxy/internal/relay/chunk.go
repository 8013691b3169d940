package relay

import "errors"

// Bounds on what an upstream's chunked framing may hold.
const (
	// maxSizeDigits bounds a chunk size's hex digits (15: under 2^60).
	maxSizeDigits = 15
	// maxLine bounds a chunk-size line's extension and one trailer line.
	maxLine = 4 << 10
	// maxTrailers bounds the trailer section.
	maxTrailers = 16 << 10
)

// Framing errors.
var (
	ErrChunkSize  = errors.New("relay: bad chunk size")
	ErrChunkLine  = errors.New("relay: chunk line too long or with a control byte")
	ErrChunkEnd   = errors.New("relay: chunk data not followed by CRLF")
	ErrTrailers   = errors.New("relay: trailer section too long")
	ErrAfterFinal = errors.New("relay: bytes after the end of the body")
)

// Decoder states.
const (
	stSize      uint8 = iota // reading the chunk size's hex digits
	stExt                    // reading a chunk extension, up to CR
	stSizeLF                 // expecting the LF of the size line
	stData                   // reading chunk data
	stDataCR                 // expecting the CR after chunk data
	stDataLF                 // expecting the LF after chunk data
	stTrailer                // at the start of a trailer line (or the final CRLF)
	stTrailerLn              // inside a trailer line, up to CR
	stTrailerLF              // expecting a trailer line's LF
	stEndLF                  // expecting the LF of the final CRLF
	stDone                   // the body ended
)

// Decoder reads HTTP/1.1 chunked framing as it arrives, in pieces of any
// size, and finds the body bytes in it. Lines end in CRLF. Chunk extensions
// and trailers are checked and dropped. The zero value is ready for a new
// body.
type Decoder struct {
	state    uint8
	digits   uint8
	line     int    // bytes of the current extension or trailer line
	trailers int    // bytes of the trailer section
	size     uint64 // data bytes left in the current chunk
}

// Done reports whether the body's end (the last chunk and the trailer
// section) was read.
func (d *Decoder) Done() bool { return d.state == stDone }

// Feed reads p and appends its body bytes to dst. It returns dst, the bytes
// of p it consumed (all of them unless the body ended inside p or the
// framing broke) and the framing error, if any. Bytes after the body's end
// are left unconsumed.
func (d *Decoder) Feed(dst, p []byte) ([]byte, int, error) {
	i := 0
	for i < len(p) {
		c := p[i]
		switch d.state {
		case stSize:
			v, ok := hexVal(c)
			switch {
			case ok:
				if d.digits == maxSizeDigits {
					return dst, i, ErrChunkSize
				}
				d.size = d.size<<4 | uint64(v)
				d.digits++
			case d.digits == 0:
				return dst, i, ErrChunkSize
			case c == '\r':
				d.state = stSizeLF
			case c == ';' || c == ' ' || c == '\t':
				d.state, d.line = stExt, 0
			default:
				return dst, i, ErrChunkSize
			}
		case stExt:
			if c == '\r' {
				d.state = stSizeLF
				break
			}
			if d.line++; d.line > maxLine || ctlByte(c) {
				return dst, i, ErrChunkLine
			}
		case stSizeLF:
			if c != '\n' {
				return dst, i, ErrChunkSize
			}
			d.digits = 0
			if d.size == 0 {
				d.state, d.line = stTrailer, 0
			} else {
				d.state = stData
			}
		case stData:
			n := uint64(len(p) - i)
			if n > d.size {
				n = d.size
			}
			dst = append(dst, p[i:i+int(n)]...)
			i += int(n)
			if d.size -= n; d.size == 0 {
				d.state = stDataCR
			}
			continue
		case stDataCR:
			if c != '\r' {
				return dst, i, ErrChunkEnd
			}
			d.state = stDataLF
		case stDataLF:
			if c != '\n' {
				return dst, i, ErrChunkEnd
			}
			d.state = stSize
		case stTrailer:
			if c == '\r' {
				d.state = stEndLF
				break
			}
			d.state, d.line = stTrailerLn, 0
			continue // the byte is the line's first
		case stTrailerLn:
			if c == '\r' {
				d.state = stTrailerLF
				break
			}
			d.line++
			d.trailers++
			if d.line > maxLine || ctlByte(c) {
				return dst, i, ErrChunkLine
			}
			if d.trailers > maxTrailers {
				return dst, i, ErrTrailers
			}
		case stTrailerLF:
			if c != '\n' {
				return dst, i, ErrChunkLine
			}
			d.state = stTrailer
		case stEndLF:
			if c != '\n' {
				return dst, i, ErrChunkEnd
			}
			d.state = stDone
			return dst, i + 1, nil
		case stDone:
			return dst, i, ErrAfterFinal
		}
		i++
	}
	return dst, i, nil
}

// ctlByte reports a control byte other than HTAB, which no chunk
// extension or trailer line may hold.
func ctlByte(c byte) bool { return (c < ' ' && c != '\t') || c == 0x7f }

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// appendChunk appends data framed as one chunk.
func appendChunk(dst, data []byte) []byte {
	const hex = "0123456789abcdef"
	var h [16]byte
	i := len(h)
	for n := uint64(len(data)); ; n >>= 4 {
		i--
		h[i] = hex[n&0xf]
		if n < 16 {
			break
		}
	}
	dst = append(dst, h[i:]...)
	dst = append(dst, '\r', '\n')
	dst = append(dst, data...)
	return append(dst, '\r', '\n')
}

// lastChunk ends a chunked body (no trailers).
var lastChunk = []byte("0\r\n\r\n")
