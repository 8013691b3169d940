package gossip

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/warmroute/warmroute/internal/identity"
	"sync"
	"sync/atomic"
	"time"
)

// Identity is this router's cluster identity (the node implements it with
// internal/identity.Bundle). With one in Config, every load packet, goodbye
// and push/pull state this node sends is signed, and figures from another
// node count only when signed by a certificate, issued by the cluster CA,
// that proves that node's name.
type Identity interface {
	// Chain is this router's certificate chain, DER, leaf first; it
	// proves Config.NodeName.
	Chain() [][]byte
	// Sign signs msg with this router's private key.
	Sign(msg []byte) ([]byte, error)
	// Verifier checks a peer's chain against the cluster CA and returns
	// the router name it proves, a function that verifies that router's
	// signatures, and when the proof expires.
	Verifier(chain [][]byte) (name string, verify func(msg, sig []byte) bool, notAfter time.Time, err error)
}

// ErrIdentity is returned by New when the Identity does not prove
// Config.NodeName or cannot sign.
var ErrIdentity = errors.New("gossip: identity")

// keyID names a certificate chain on the wire: the first bytes of a
// SHA-256 over the chain's certificates, each preceded by its length.
type keyID [keyIDLen]byte

func chainID(chain [][]byte) keyID {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, c := range chain {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(c)))])
		h.Write(c)
	}
	var id keyID
	copy(id[:], h.Sum(nil))
	return id
}

// Reasons a message or figure from another node is rejected; each has
// its own rejected_total counter.
type reject uint8

const (
	rejUnsigned     reject = iota // unsigned (version 1) message to a node with an Identity
	rejUnknownKey                 // signed with a chain this node has not verified
	rejBadChain                   // chain not from the cluster CA, expired, or naming no router
	rejWrongName                  // chain proves another name than the sender claims
	rejBadSignature               // signature does not verify
	rejChainRate                  // chain verification deferred: too many new chains
	rejClockSkew                  // signed too long ago or in the future (replay)
	rejRange                      // a figure out of its range
	rejTooMany                    // a node reports more than MaxBackends backends
	rejMemberName                 // a member whose name is not a valid router name
	rejStateSize                  // a push/pull state over maxStateBytes
	rejStreamLimit                // a TCP stream over the listener's caps (internal/limit)
	rejRevoked                    // chain revoked by the cluster (its name or serial number)
	numRejects
)

var rejectNames = [numRejects]string{
	rejUnsigned:     "unsigned",
	rejUnknownKey:   "unknown_key",
	rejBadChain:     "bad_chain",
	rejWrongName:    "wrong_name",
	rejBadSignature: "bad_signature",
	rejChainRate:    "chain_rate_limited",
	rejClockSkew:    "clock_skew",
	rejRange:        "out_of_range",
	rejTooMany:      "too_many_backends",
	rejMemberName:   "bad_member_name",
	rejStateSize:    "state_too_large",
	rejStreamLimit:  "stream_limit",
	rejRevoked:      "revoked",
}

func (r reject) String() string { return rejectNames[r] }

// rejects counts rejections by reason.
type rejects [numRejects]atomic.Uint64

func (r *rejects) add(why reject) { r[why].Add(1) }

// maxClockSkew bounds how far a signed message's send time may be from
// this node's clock. A captured signed packet is useless to replay after
// this long; within it, the (instance, seq) order makes a replay a no-op.
const maxClockSkew = 30 * time.Second

// signer signs this node's messages.
type signer struct {
	id     Identity
	key    keyID
	chain  [][]byte
	sigMax int // upper bound of a signature's length
}

func newSigner(id Identity, name string) (*signer, error) {
	chain := id.Chain()
	if len(chain) == 0 || len(chain) > maxChainCerts {
		return nil, fmt.Errorf("%w: chain of %d certificates (want 1-%d)", ErrIdentity, len(chain), maxChainCerts)
	}
	for _, c := range chain {
		if len(c) == 0 || len(c) > maxCertLen {
			return nil, fmt.Errorf("%w: certificate of %d bytes (at most %d)", ErrIdentity, len(c), maxCertLen)
		}
	}
	proven, verify, notAfter, err := id.Verifier(chain)
	if err != nil {
		return nil, fmt.Errorf("%w: own chain: %v", ErrIdentity, err)
	}
	if proven != name {
		return nil, fmt.Errorf("%w: the certificate proves %q, not the node name %q", ErrIdentity, proven, name)
	}
	if !time.Now().Before(notAfter) {
		return nil, fmt.Errorf("%w: the certificate expired at %v", ErrIdentity, notAfter)
	}
	s := &signer{id: id, key: chainID(chain), chain: chain}
	// ECDSA signatures vary by a few bytes; take the largest of a few,
	// plus a margin, to size packets.
	probe := []byte(sigContext + "probe")
	for range 4 {
		sig, err := id.Sign(probe)
		if err != nil {
			return nil, fmt.Errorf("%w: sign: %v", ErrIdentity, err)
		}
		if !verify(probe, sig) {
			return nil, fmt.Errorf("%w: the key does not match the certificate", ErrIdentity)
		}
		s.sigMax = max(s.sigMax, len(sig)+8)
	}
	if s.sigMax > maxSig {
		return nil, fmt.Errorf("%w: signatures of %d bytes (at most %d)", ErrIdentity, s.sigMax, maxSig)
	}
	return s, nil
}

// overhead is what signing adds to a version 1 message, at most.
func (s *signer) overhead() int { return keyIDLen + binary.MaxVarintLen64 + s.sigMax }

// sign appends the signed (version 2) form of the version 1 message msg,
// which holds one block, to dst. scratch holds the signed input and is
// reused across calls by one goroutine.
func (s *signer) sign(dst, msg []byte, now time.Time, scratch *[]byte) ([]byte, error) {
	start := len(dst)
	dst = appendSignedHead(dst, msg, s.key, uint64(now.UnixMilli()))
	in := append(append((*scratch)[:0], sigContext...), dst[start:]...)
	*scratch = in
	sig, err := s.id.Sign(in)
	if err != nil {
		return dst[:start], err
	}
	if len(sig) == 0 || len(sig) > maxSig {
		return dst[:start], fmt.Errorf("%w: signature of %d bytes", ErrIdentity, len(sig))
	}
	return append(dst, sig...), nil
}

// chainMsg is this node's chain message.
func (s *signer) chainMsg(name string, want bool) []byte {
	return appendChainMsg(nil, name, s.chain, want)
}

// peerKey is a verified chain: the name it proves and its key.
type peerKey struct {
	name     string
	verify   func(msg, sig []byte) bool
	notAfter time.Time
}

// verifySig checks sig over sigContext || signed; scratch is reused by one
// goroutine.
func (k *peerKey) verifySig(signed, sig []byte, scratch *[]byte) bool {
	in := append(append((*scratch)[:0], sigContext...), signed...)
	*scratch = in
	return k.verify(in, sig)
}

// keyCache holds the chains this node verified, by id: each is verified
// once and used until its proof expires, then verified again when it
// next arrives. Chains that failed are remembered for badChainTTL, so a
// repeated bad chain costs a map lookup. Verifying new chains is rate
// limited (a token bucket), and the cache is bounded.
type keyCache struct {
	id Identity

	mu      sync.Mutex
	entries map[keyID]*keyEntry
	tokens  float64
	last    time.Time
}

type keyEntry struct {
	key   *peerKey  // nil: the chain failed verification
	until time.Time // the proof's expiry, or when to try a bad chain again
	why   reject
}

const (
	maxKeys          = 1024
	badChainTTL      = time.Minute
	chainVerifyRate  = 20 // new chains verified per second, sustained
	chainVerifyBurst = 64 // and at once (a joiner learns every member's chain)
)

func newKeyCache(id Identity) *keyCache {
	return &keyCache{id: id, entries: make(map[keyID]*keyEntry), tokens: chainVerifyBurst}
}

// lookup returns the verified key with id, or nil.
func (k *keyCache) lookup(id keyID, now time.Time) *peerKey {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.entries[id]
	if e == nil || e.key == nil {
		return nil
	}
	if !now.Before(e.until) {
		delete(k.entries, id)
		return nil
	}
	return e.key
}

// learn verifies chain (or finds it verified) and returns its key, or the
// reason it is refused.
func (k *keyCache) learn(chain [][]byte, now time.Time) (keyID, *peerKey, reject, bool) {
	id := chainID(chain)
	k.mu.Lock()
	if e := k.entries[id]; e != nil && now.Before(e.until) {
		k.mu.Unlock()
		return id, e.key, e.why, e.key != nil
	}
	k.tokens = min(chainVerifyBurst, k.tokens+now.Sub(k.last).Seconds()*chainVerifyRate)
	k.last = now
	if k.tokens < 1 {
		k.mu.Unlock()
		return id, nil, rejChainRate, false
	}
	k.tokens--
	k.mu.Unlock()

	// Verify outside the lock: it parses certificates and checks
	// signatures.
	name, verify, notAfter, err := k.id.Verifier(chain)
	e := &keyEntry{key: &peerKey{name: name, verify: verify, notAfter: notAfter}, until: notAfter}
	if err != nil || verify == nil || !now.Before(notAfter) || checkName(name) != nil {
		e = &keyEntry{until: now.Add(badChainTTL), why: rejBadChain}
		if errors.Is(err, identity.ErrRevoked) {
			e.why = rejRevoked
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.entries) >= maxKeys {
		k.evict(now)
	}
	k.entries[id] = e
	return id, e.key, e.why, e.key != nil
}

// evict makes room: expired entries first, then failed chains, then any.
func (k *keyCache) evict(now time.Time) {
	for id, e := range k.entries {
		if !now.Before(e.until) {
			delete(k.entries, id)
		}
	}
	for id, e := range k.entries {
		if len(k.entries) < maxKeys {
			return
		}
		if e.key == nil {
			delete(k.entries, id)
		}
	}
	for id := range k.entries {
		if len(k.entries) < maxKeys {
			return
		}
		delete(k.entries, id)
	}
}

// checkName reports whether name can name a router (identity.CheckName:
// the same rule holds for member names and the names certificates prove).
func checkName(name string) error {
	if err := identity.CheckName(name); err != nil {
		return fmt.Errorf("%w: node name: %v", ErrInvalidConfig, err)
	}
	return nil
}
