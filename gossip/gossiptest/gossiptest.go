package gossiptest

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/warmroute/warmroute/gossip"
)

// Wire constants (docs/gossip.md, "Wire format").
const (
	magic         = 0x57
	versionV1     = 1
	versionV2     = 2
	sealedVersion = 0xE1

	kindPublish = 1
	kindBye     = 3
	kindChain   = 4

	tagLoads  = 1
	tagEngine = 2
	tagHealth = 4

	healthFailing = 0x01
	engineOK      = 0x80
	chainWant     = 0x01

	sigContext = "warmroute gossip signature v2\x00"
)

// Engine is one backend's engine figures in a forged publish, Age old.
type Engine struct {
	Backend string
	Stats   gossip.EngineStats
	Age     time.Duration
}

// ForgePublish returns a sealed, unsigned load packet claiming to be
// publish seq of origin's run instance: in-flight counts and verdicts
// (BackendLoad.Failing) for loads, and engine figures. key is the gossip
// key (empty: a plaintext packet, for clusters without one).
func ForgePublish(key []byte, origin string, instance, seq uint64, loads []gossip.BackendLoad, engines ...Engine) ([]byte, error) {
	return Seal(key, message(kindPublish, origin, instance, seq, loads, engines))
}

// ForgeBye returns a sealed, unsigned goodbye in origin's name: a router
// without an Identity drops origin's figures at once.
func ForgeBye(key []byte, origin string, instance, seq uint64) ([]byte, error) {
	return Seal(key, message(kindBye, origin, instance, seq, nil, nil))
}

// ForgeSigned returns a sealed load packet like ForgePublish, signed with
// id's key, sent now: what a node holding a certificate of its own (from
// another CA, or valid but for another name) would send in origin's name.
func ForgeSigned(key []byte, id gossip.Identity, origin string, instance, seq uint64, loads []gossip.BackendLoad, engines ...Engine) ([]byte, error) {
	msg := message(kindPublish, origin, instance, seq, loads, engines)
	kid := chainID(id.Chain())
	out := append([]byte{magic, versionV2, msg[2]}, kid[:]...)
	out = binary.AppendUvarint(out, uint64(time.Now().UnixMilli()))
	out = append(out, msg[3:]...)
	sig, err := id.Sign(append([]byte(sigContext), out...))
	if err != nil {
		return nil, err
	}
	return Seal(key, append(out, sig...))
}

// ForgeChain returns a sealed chain message in which origin presents
// chain (DER, leaf first); want asks the receiver for its own chain.
func ForgeChain(key []byte, origin string, chain [][]byte, want bool) ([]byte, error) {
	var flags byte
	if want {
		flags = chainWant
	}
	b := []byte{magic, versionV2, kindChain, flags}
	b = appendString(b, origin)
	b = binary.AppendUvarint(b, uint64(len(chain)))
	for _, c := range chain {
		b = appendString(b, string(c))
	}
	return Seal(key, b)
}

// Send sends packets over UDP to a router's gossip address (host:port).
func Send(addr string, pkts ...[]byte) error {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, p := range pkts {
		if _, err := conn.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// Seal seals a message as routers seal load packets under key: AES-GCM
// with a random nonce and the two header bytes as additional data. With
// an empty key it returns msg.
func Seal(key, msg []byte) ([]byte, error) {
	if len(key) == 0 {
		return msg, nil
	}
	g, err := gcm(key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 2+g.NonceSize(), 2+g.NonceSize()+len(msg)+g.Overhead())
	out[0], out[1] = magic, sealedVersion
	if _, err := rand.Read(out[2:]); err != nil {
		return nil, err
	}
	return g.Seal(out, out[2:], msg, out[:2]), nil
}

// Open returns the message in a sealed load packet.
func Open(key, pkt []byte) ([]byte, error) {
	if len(key) == 0 {
		return pkt, nil
	}
	g, err := gcm(key)
	if err != nil {
		return nil, err
	}
	if len(pkt) < 2+g.NonceSize()+g.Overhead() || pkt[0] != magic || pkt[1] != sealedVersion {
		return nil, errors.New("gossiptest: not a sealed load packet")
	}
	return g.Open(nil, pkt[2:2+g.NonceSize()], pkt[2+g.NonceSize():], pkt[:2])
}

func gcm(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("gossiptest: key: %w", err)
	}
	return cipher.NewGCM(block)
}

// message encodes an unsigned (version 1) message with one block.
func message(kind byte, origin string, instance, seq uint64, loads []gossip.BackendLoad, engines []Engine) []byte {
	body := appendString(nil, origin)
	body = binary.AppendUvarint(body, instance)
	body = binary.AppendUvarint(body, seq)
	var ls, hs, es []byte
	for _, l := range loads {
		ls = appendString(ls, l.Backend)
		ls = binary.AppendVarint(ls, l.InFlight)
		if l.Failing {
			hs = appendString(hs, l.Backend)
			hs = append(hs, healthFailing)
		}
	}
	for _, e := range engines {
		es = appendString(es, e.Backend)
		flags := e.Stats.Known &^ engineOK
		if e.Stats.OK {
			flags |= engineOK
		}
		es = append(es, flags)
		for _, f := range [4]float64{e.Stats.KVUsage, e.Stats.Running, e.Stats.Waiting, e.Stats.PrefixHitRate} {
			es = binary.LittleEndian.AppendUint32(es, math.Float32bits(float32(f)))
		}
		es = binary.AppendUvarint(es, uint64(max(e.Age, 0)/time.Millisecond))
	}
	body = appendSection(body, tagLoads, ls)
	body = appendSection(body, tagEngine, es)
	body = appendSection(body, tagHealth, hs)
	msg := []byte{magic, versionV1, kind}
	msg = binary.AppendUvarint(msg, uint64(len(body)))
	return append(msg, body...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendSection(dst []byte, tag byte, payload []byte) []byte {
	if len(payload) == 0 {
		return dst
	}
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(len(payload)))
	return append(dst, payload...)
}

// chainID is the id a signed message names its chain by.
func chainID(chain [][]byte) [16]byte {
	h := sha256.New()
	for _, c := range chain {
		h.Write(binary.AppendUvarint(nil, uint64(len(c))))
		h.Write(c)
	}
	var id [16]byte
	copy(id[:], h.Sum(nil))
	return id
}
