package gossip

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
)

// Load packets travel outside memberlist (see transport), so they carry
// their own encryption with the same shared keys: AES-GCM with a random
// nonce, sealed once per packet and sent to every member.
//
//	plaintext: message (starts wireMagic, wireVersion)
//	sealed:    wireMagic sealedVersion nonce(12) AES-GCM(message, aad = first two bytes)
const sealedVersion = 0xE1

type sealer struct {
	aeads []cipher.AEAD // primary first; nil when plaintext
}

func newSealer(primary []byte, extra [][]byte) (*sealer, error) {
	s := &sealer{}
	for _, k := range append([][]byte{primary}, extra...) {
		if len(k) == 0 {
			continue
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, fmt.Errorf("gossip: key: %w", err)
		}
		gcm, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("gossip: key: %w", err)
		}
		s.aeads = append(s.aeads, gcm)
	}
	return s, nil
}

// seal appends the packet for msg to dst (msg itself when plaintext).
func (s *sealer) seal(dst, msg []byte) []byte {
	if len(s.aeads) == 0 {
		return append(dst, msg...)
	}
	g := s.aeads[0]
	dst = append(dst, wireMagic, sealedVersion)
	hdr := len(dst) - 2
	nonceAt := len(dst)
	var nonce [12]byte // GCM's standard nonce size
	dst = append(dst, nonce[:g.NonceSize()]...)
	_, _ = rand.Read(dst[nonceAt:])
	return g.Seal(dst, dst[nonceAt:nonceAt+g.NonceSize()], msg, dst[hdr:hdr+2])
}

// open returns the message in packet b, decrypted into scratch when
// sealed, or ErrBadMessage when b is not sealed the way this node expects
// (plaintext to a keyed node, sealed to a plaintext one, wrong key).
func (s *sealer) open(scratch, b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != wireMagic {
		return nil, ErrBadMessage
	}
	if len(s.aeads) == 0 {
		if b[1] == sealedVersion {
			return nil, fmt.Errorf("%w: sealed packet but no key", ErrBadMessage)
		}
		return b, nil
	}
	if b[1] != sealedVersion {
		return nil, fmt.Errorf("%w: plaintext packet but a key is set", ErrBadMessage)
	}
	n := s.aeads[0].NonceSize()
	if len(b) < 2+n+s.aeads[0].Overhead() {
		return nil, ErrBadMessage
	}
	for _, g := range s.aeads {
		if out, err := g.Open(scratch[:0], b[2:2+n], b[2+n:], b[:2]); err == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w: cannot decrypt (wrong key?)", ErrBadMessage)
}
