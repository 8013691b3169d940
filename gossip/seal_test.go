package gossip

import (
	"bytes"
	"errors"
	"testing"
)

func TestSeal(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 32)
	msg := publishMsg("a", 1, 1, map[string]int64{"x": 3})
	plain, _ := newSealer(nil, nil)
	one, _ := newSealer(k1, nil)
	rotating, _ := newSealer(k2, [][]byte{k1}) // new primary, old key still accepted
	two, _ := newSealer(k2, nil)
	scratch := make([]byte, 0, 2048)

	if got, err := plain.open(scratch, plain.seal(nil, msg)); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("plaintext round trip: %v", err)
	}
	sealed := one.seal(nil, msg)
	if bytes.Contains(sealed, []byte("x")) && bytes.Contains(sealed[2:], msg[3:]) {
		t.Fatal("sealed packet contains the plaintext")
	}
	if sealed[0] != wireMagic || sealed[1] != sealedVersion {
		t.Fatalf("header % x", sealed[:2])
	}
	if got, err := one.open(scratch, sealed); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("sealed round trip: %v", err)
	}
	if got, err := rotating.open(scratch, sealed); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("old key during rotation: %v", err)
	}
	if _, err := two.open(scratch, sealed); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("wrong key: %v", err)
	}
	if _, err := one.open(scratch, msg); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("plaintext accepted by a keyed node: %v", err)
	}
	if _, err := plain.open(scratch, sealed); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("sealed accepted by a plaintext node: %v", err)
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	if _, err := one.open(scratch, tampered); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("tampered packet: %v", err)
	}
	if _, err := one.open(scratch, sealed[:10]); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("short packet: %v", err)
	}
	if a, b := one.seal(nil, msg), one.seal(nil, msg); bytes.Equal(a, b) {
		t.Fatal("nonce reused")
	}
}
