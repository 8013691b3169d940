package gossip

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/warmroute/warmroute/internal/identity"
)

// Wire format. All integers are varints (encoding/binary); strings are a
// uvarint length then the bytes.
//
// Version 1 (unsigned; nodes without an Identity):
//
//	message = magic(0x57) version(1) kind block*
//	block   = uvarint(len) origin:string instance:uvarint seq:uvarint section*
//	section = tag:byte uvarint(len) entry*
//
//	tagLoads      entry = backend:string inFlight:varint
//	tagEngine     entry = backend:string flags:byte kv,run,wait,hit:float32le scrapeAgeMs:uvarint
//	tagLoadsRelay entry = backend:string inFlight:varint seq:uvarint ageMs:uvarint
//	tagHealth     entry = backend:string flags:byte (healthFailing: the sender sees it failing)
//	tagChain      payload = chain (version 2 state messages only)
//	tagParts      payload = partitions:uvarint (partition:uvarint count:uvarint)*
//	tagHot        payload = (key:uint64le depth:uvarint)*
//	tagHotCounts  payload = total:uvarint partitions:uvarint (key:uint64le depth:uvarint count:uvarint part:uvarint)*
//	tagCost       payload = unit:uvarint requests:uvarint flags:byte (costFromAnswers)
//
// A kindPublish message carries one block from its sender; figures in a
// tagLoads section carry the block's seq and are fresh. A kindState
// message (memberlist push/pull) carries the sender's own block plus one
// relay block per other node it knows, whose tagLoadsRelay entries carry
// their own seq and age. A tagHealth section marks backends of the same
// block's tagLoads section that the sender sees failing (its own health
// checks or passive ejection); a tagLoads entry without one is healthy,
// and relayed figures say nothing about health. A tagParts section (in a
// sender's own publish block, about once a second) carries the sender's
// busiest ring partitions by recent request count, for the Raft leader's
// balancer; partitions is the sender's ring partition count, so counts of
// a ring of another size are not mixed. A tagHot section (in a sender's
// own publish block, about twice a second) carries the prompt prefixes the
// sender's own traffic calls to split (ring.Split: a block-chain key and
// its depth), for the Raft leader, which splits what any router's traffic
// calls for. A tagHotCounts section (beside it, from version 0.x of
// pressure splits on) carries the same prefixes with the sender's recent
// request count of each and of all its traffic (total), and the ring
// partition each prefix's requests route on at the sender (part, of a ring
// of partitions partitions): the leader adds the counts up across routers
// and splits a prefix only when the owner of that partition is pressed
// (node/splits.go); it ignores tagHot, which earlier leaders read.
// A tagCost section (in a sender's own publish block, about once a second)
// carries the sender's own recompute work unit (the bytes of prompt an
// average request of its traffic makes a backend prefill, proxy's
// RecomputeFigures) and its requests in its last period, for the Raft
// leader, which commits their weighted median so every router weighs a move
// off an owner alike (node/cost.go).
// A kindBye message is a block without sections:
// its sender is leaving and its figures must be dropped now.
//
// Version 2 (signed; nodes with an Identity) wraps exactly one block, the
// sender's own, and signs everything before the signature:
//
//	message = magic(0x57) version(2) kind(1-3) key:16 sentAtMs:uvarint uvarint(len) block signature
//	chain message (not signed; the certificates prove themselves):
//	          magic(0x57) version(2) kindChain flags:byte origin:string chain
//	chain   = count:uvarint (uvarint(len) certificate:DER)*, leaf first
//
// key is the chain's id (chainID: the first 16 bytes of a SHA-256 of the
// chain) the receiver verifies the signature with; sentAtMs is the
// sender's wall clock. The signature is Identity.Sign(sigContext ||
// message-before-the-signature) and runs to the end of the message. A
// version 2 message never carries relay sections (figures of other nodes
// cannot be verified); its state message carries the sender's chain in a
// tagChain section. flags bit chainWant asks the receiver to answer with
// its own chain message.
//
// instance identifies one run of a node (its start time in nanoseconds);
// seq counts publishes within a run. (instance, seq) orders figures from
// one node. Sections with unknown tags are skipped, so a later version can
// add per-backend fields (such as local health) without breaking older
// nodes; a new version byte is only for incompatible changes.
const (
	wireMagic = 0x57
	// wireVersion is the highest version this node speaks (Meta.Wire).
	wireVersion = wireV2
	wireV1      = 1
	wireV2      = 2

	kindPublish = 1
	kindState   = 2
	kindBye     = 3
	kindChain   = 4 // version 2 only

	tagLoads      = 1
	tagEngine     = 2
	tagLoadsRelay = 3
	tagHealth     = 4
	tagChain      = 5
	tagParts      = 6
	tagHot        = 7
	tagHotCounts  = 8
	tagCost       = 9

	// maxString bounds any string on the wire.
	maxString = 1024
	// maxNodeName bounds node names (origins); it is identity.MaxNameLen.
	maxNodeName = identity.MaxNameLen
	// maxBackendID bounds backend ids (node configurations allow 253).
	maxBackendID = 256
	// MaxBackends bounds the backends one node may report: the entries
	// of each kind in one message, and the figures held per node. It is
	// ring.MaxBackends.
	MaxBackends = 4096
	// MaxPartEntries bounds the partitions of one tagParts section (at
	// most 10 bytes each, so a section fits a packet beside a signature).
	MaxPartEntries = 96
	// MaxHotEntries bounds the prefixes of one tagHot section (9 bytes
	// each, so a section fits a packet beside a signature).
	MaxHotEntries = 64
	// MaxHotDepth bounds a hot prefix's depth (ring.MaxChainBlocks).
	MaxHotDepth = 64
	// MaxHotCounted bounds the prefixes of one tagHotCounts section (at
	// most 27 bytes each, so a section fits a packet beside a signature).
	MaxHotCounted = 40
	// MaxHotTotal bounds a tagHotCounts section's total and counts (a
	// router's decayed request count, in its fixed-point unit).
	MaxHotTotal = 1 << 40
	// MaxCostUnit bounds a tagCost section's unit (proxy.MaxRecomputeUnit)
	// and MaxCostRequests its request count.
	MaxCostUnit     = 1 << 31
	MaxCostRequests = 1 << 40
	// MaxPartitions bounds a tagParts section's partition count (it is
	// ring's bound on PartitionCount).
	MaxPartitions = 1 << 20
	// maxBlocks bounds the blocks of one (version 1 state) message.
	maxBlocks = 1024
	// maxPacket bounds one UDP payload so that, with memberlist's framing
	// (message type, CRC) and AES-GCM overhead, a packet stays below the
	// usual 1500-byte MTU and memberlist's 1400-byte UDP buffer.
	maxPacket = 1300
	// maxStateBytes bounds a push/pull state, sent or accepted.
	maxStateBytes = 4 << 20

	// keyIDLen is the length of a chain id on the wire.
	keyIDLen = 16
	// maxSig bounds a signature (RSA-4096 makes 512 bytes).
	maxSig = 1024
	// maxChainCerts and maxCertLen bound a certificate chain.
	maxChainCerts = 8
	maxCertLen    = 8192
	// maxChainMsg bounds this node's chain message (a UDP packet; one
	// over maxPacket is fragmented by IP).
	maxChainMsg = 16 << 10

	engineOK = 0x80

	healthFailing = 0x01

	chainWant = 0x01

	costFromAnswers = 0x01
)

// sigContext starts every signed input, so a gossip signature can never
// be taken for a signature of anything else made with the same key.
const sigContext = "warmroute gossip signature v2\x00"

// Ranges of figures from other nodes. Figures outside them are dropped
// and counted (rejected_total{reason="out_of_range"}), never clamped.
const (
	// MaxInFlight bounds one node's in-flight count for one backend.
	MaxInFlight = 1 << 20
	// MaxEngineRequests bounds a backend's running and waiting requests.
	MaxEngineRequests = 1 << 20
	// maxAge bounds the age of a relayed figure or an engine scrape.
	maxAge = time.Hour
)

// Engine metric bits in EngineStats.Known (the values of
// proxy/engine's Known* bits, which the node copies unchanged).
const (
	EngineKVUsage uint8 = 1 << iota
	EngineRunning
	EngineWaiting
	EnginePrefixHitRate
)

type wireMsg struct {
	version byte
	kind    byte
	blocks  []wireBlock

	// Version 2 signed messages.
	key    keyID
	sentAt uint64 // ms since the Unix epoch, by the sender's clock
	signed []byte // what the signature covers (after sigContext)
	sig    []byte

	// Version 2 chain messages.
	want   bool
	origin []byte
	chain  [][]byte
}

type wireBlock struct {
	origin   []byte
	instance uint64
	seq      uint64
	loads    []wireLoad
	engines  []wireEngine
	failing  [][]byte // backends of loads the origin sees failing
	chain    [][]byte // tagChain: the origin's certificate chain
	relays   bool     // holds a tagLoadsRelay section
	parts    uint64   // tagParts: the origin's partition count (0: no section)
	partLoad []PartLoad
	hasHot   bool // holds a tagHot section
	hot      []HotPrefix
	// A tagHotCounts section: the sender's request count, its ring's
	// partition count and its counted prefixes.
	hasHotC   bool
	hotTotal  uint64
	hotParts  uint64
	hotCounts []HotPrefix
	// A tagCost section.
	hasCost bool
	cost    CostFigure
}

// CostFigure is what one router's own traffic says of the recompute work
// unit (see proxy.RecomputeFigures): the unit in bytes, whether the
// cached share in it came from answers' usage reports, and the router's
// requests in its last period, which weigh it.
type CostFigure struct {
	Unit        uint64
	Requests    uint64
	FromAnswers bool
}

// HotPrefix is a prompt prefix a router's traffic calls to split: a
// block-chain key and its depth in blocks (ring.Split); in a counted
// section (HotReport) also the sender's recent request count of it and
// the ring partition its requests route on at the sender.
type HotPrefix struct {
	Key   uint64
	Depth uint32
	Count uint64
	Part  uint32
}

// PartLoad is one ring partition's recent request count on one router, in
// the unit the router counts in (see Mesh.PublishPartitions).
type PartLoad struct {
	Partition uint32
	Count     uint32
}

type wireLoad struct {
	backend  []byte
	inFlight int64
	seq      uint64
	age      time.Duration
	relay    bool // from a tagLoadsRelay section: says nothing of health
	failing  bool // the origin sees the backend failing (set from failing)
}

type wireEngine struct {
	backend []byte
	stats   EngineStats // Scraped is unset; age says how old
	age     time.Duration
}

// decode parses b into m, reusing m's slices. The byte slices in m point
// into b. Structure and sizes are checked here; the ranges of figures are
// checked where they are applied (state), which drops and counts them
// one by one.
func (m *wireMsg) decode(b []byte) error {
	m.blocks = m.blocks[:0]
	m.chain = m.chain[:0]
	m.signed, m.sig, m.origin, m.want, m.sentAt, m.key = nil, nil, nil, false, 0, keyID{}
	if len(b) < 3 || b[0] != wireMagic {
		return ErrBadMessage
	}
	m.version, m.kind = b[1], b[2]
	switch m.version {
	case wireV1:
		if m.kind < kindPublish || m.kind > kindBye {
			return fmt.Errorf("%w: kind %d", ErrBadMessage, m.kind)
		}
		return m.decodeBlocks(b[3:])
	case wireV2:
	default:
		return ErrUnknownVersion
	}
	r := reader{b: b[3:]}
	switch m.kind {
	case kindPublish, kindState, kindBye:
	case kindChain:
		flags := r.byte1()
		m.want = flags&chainWant != 0
		m.origin = r.str(maxNodeName)
		var err error
		if m.chain, err = r.chainList(m.chain); err != nil {
			return err
		}
		if r.err || len(m.origin) == 0 || len(r.b) != 0 {
			return ErrBadMessage
		}
		return nil
	default:
		return fmt.Errorf("%w: kind %d", ErrBadMessage, m.kind)
	}
	if len(r.b) < keyIDLen {
		return ErrBadMessage
	}
	copy(m.key[:], r.b)
	r.b = r.b[keyIDLen:]
	m.sentAt = r.uvarint()
	n := r.uvarint()
	if r.err || n > uint64(len(r.b)) {
		return ErrBadMessage
	}
	body := r.b[:n]
	m.sig = r.b[n:]
	if len(m.sig) == 0 || len(m.sig) > maxSig {
		return fmt.Errorf("%w: signature of %d bytes", ErrBadMessage, len(m.sig))
	}
	m.signed = b[:len(b)-len(m.sig)]
	// The block, as a version 1 message body holds it.
	if err := m.decodeBlock(body); err != nil {
		return err
	}
	if blk := &m.blocks[0]; blk.relays || (len(blk.chain) > 0 && m.kind != kindState) {
		return fmt.Errorf("%w: relayed figures or a chain in a signed %d message", ErrBadMessage, m.kind)
	}
	return nil
}

// decodeBlocks parses a version 1 message body: length-prefixed blocks.
func (m *wireMsg) decodeBlocks(b []byte) error {
	r := reader{b: b}
	for len(r.b) > 0 {
		n := r.uvarint()
		if r.err || n > uint64(len(r.b)) || len(m.blocks) >= maxBlocks {
			return ErrBadMessage
		}
		if err := m.decodeBlock(r.b[:n]); err != nil {
			return err
		}
		r.b = r.b[n:]
	}
	if m.kind != kindState && len(m.blocks) != 1 {
		return fmt.Errorf("%w: %d blocks", ErrBadMessage, len(m.blocks))
	}
	if m.version == wireV1 {
		for i := range m.blocks {
			if len(m.blocks[i].chain) > 0 {
				return fmt.Errorf("%w: chain in an unsigned message", ErrBadMessage)
			}
		}
	}
	return nil
}

// decodeBlock appends the block in b to m.blocks.
func (m *wireMsg) decodeBlock(b []byte) error {
	if len(m.blocks) < cap(m.blocks) {
		m.blocks = m.blocks[:len(m.blocks)+1]
	} else {
		m.blocks = append(m.blocks, wireBlock{})
	}
	body := reader{b: b}
	return m.blocks[len(m.blocks)-1].decode(&body)
}

func (blk *wireBlock) decode(r *reader) error {
	blk.loads = blk.loads[:0]
	blk.engines = blk.engines[:0]
	blk.failing = blk.failing[:0]
	blk.chain = blk.chain[:0]
	blk.relays = false
	blk.parts, blk.partLoad = 0, blk.partLoad[:0]
	blk.hasHot, blk.hot = false, blk.hot[:0]
	blk.hasHotC, blk.hotTotal, blk.hotParts, blk.hotCounts = false, 0, 0, blk.hotCounts[:0]
	blk.hasCost, blk.cost = false, CostFigure{}
	blk.origin = r.str(maxNodeName)
	blk.instance = r.uvarint()
	blk.seq = r.uvarint()
	if r.err || len(blk.origin) == 0 {
		return ErrBadMessage
	}
	for len(r.b) > 0 {
		tag := r.byte1()
		n := r.uvarint()
		if r.err || n > uint64(len(r.b)) {
			return ErrBadMessage
		}
		sec := reader{b: r.b[:n]}
		r.b = r.b[n:]
		switch tag {
		case tagLoads, tagLoadsRelay:
			blk.relays = blk.relays || tag == tagLoadsRelay
			for len(sec.b) > 0 {
				l := wireLoad{backend: sec.str(maxBackendID), inFlight: sec.varint(), seq: blk.seq}
				if tag == tagLoadsRelay {
					l.relay = true
					l.seq = sec.uvarint()
					l.age = sec.millis()
				}
				if sec.err || len(l.backend) == 0 || len(blk.loads) >= MaxBackends {
					return ErrBadMessage
				}
				blk.loads = append(blk.loads, l)
			}
		case tagEngine:
			for len(sec.b) > 0 {
				e := wireEngine{backend: sec.str(maxBackendID)}
				flags := sec.byte1()
				e.stats.OK = flags&engineOK != 0
				e.stats.Known = flags &^ engineOK
				e.stats.KVUsage = sec.float32()
				e.stats.Running = sec.float32()
				e.stats.Waiting = sec.float32()
				e.stats.PrefixHitRate = sec.float32()
				e.age = sec.millis()
				if sec.err || len(e.backend) == 0 || len(blk.engines) >= MaxBackends {
					return ErrBadMessage
				}
				blk.engines = append(blk.engines, e)
			}
		case tagHealth:
			for len(sec.b) > 0 {
				backend, flags := sec.str(maxBackendID), sec.byte1()
				if sec.err || len(backend) == 0 || len(blk.failing) >= MaxBackends {
					return ErrBadMessage
				}
				if flags&healthFailing != 0 {
					blk.failing = append(blk.failing, backend)
				}
			}
		case tagChain:
			var err error
			if len(blk.chain) > 0 {
				return ErrBadMessage
			}
			if blk.chain, err = sec.chainList(blk.chain); err != nil {
				return err
			}
			if len(sec.b) != 0 {
				return ErrBadMessage
			}
		case tagParts:
			if blk.parts != 0 {
				return ErrBadMessage
			}
			blk.parts = sec.uvarint()
			if sec.err || blk.parts == 0 || blk.parts > MaxPartitions {
				return ErrBadMessage
			}
			for len(sec.b) > 0 {
				part, count := sec.uvarint(), sec.uvarint()
				if sec.err || part >= blk.parts || count > math.MaxUint32 || len(blk.partLoad) >= MaxPartEntries {
					return ErrBadMessage
				}
				blk.partLoad = append(blk.partLoad, PartLoad{Partition: uint32(part), Count: uint32(count)})
			}
		case tagHot:
			if blk.hasHot {
				return ErrBadMessage
			}
			blk.hasHot = true
			for len(sec.b) > 0 {
				key, depth := sec.u64le(), sec.uvarint()
				if sec.err || depth >= MaxHotDepth || len(blk.hot) >= MaxHotEntries {
					return ErrBadMessage
				}
				blk.hot = append(blk.hot, HotPrefix{Key: key, Depth: uint32(depth)})
			}
		case tagHotCounts:
			if blk.hasHotC {
				return ErrBadMessage
			}
			blk.hasHotC = true
			blk.hotTotal, blk.hotParts = sec.uvarint(), sec.uvarint()
			if sec.err || blk.hotTotal > MaxHotTotal || blk.hotParts == 0 || blk.hotParts > MaxPartitions {
				return ErrBadMessage
			}
			for len(sec.b) > 0 {
				key, depth, count, part := sec.u64le(), sec.uvarint(), sec.uvarint(), sec.uvarint()
				if sec.err || depth >= MaxHotDepth || count > blk.hotTotal || part >= blk.hotParts || len(blk.hotCounts) >= MaxHotCounted {
					return ErrBadMessage
				}
				blk.hotCounts = append(blk.hotCounts, HotPrefix{Key: key, Depth: uint32(depth), Count: count, Part: uint32(part)})
			}
		case tagCost:
			if blk.hasCost {
				return ErrBadMessage
			}
			unit, requests, flags := sec.uvarint(), sec.uvarint(), sec.byte1()
			if sec.err || len(sec.b) != 0 || unit > MaxCostUnit || requests > MaxCostRequests {
				return ErrBadMessage
			}
			blk.hasCost = true
			blk.cost = CostFigure{Unit: unit, Requests: requests, FromAnswers: flags&costFromAnswers != 0}
		default:
			// A section from a later version: skip it.
		}
	}
	blk.pairHealth()
	return nil
}

// pairHealth marks the block's own (not relayed) loads its health
// section names, whatever the order of the sections.
func (blk *wireBlock) pairHealth() {
	if len(blk.failing) == 0 {
		return
	}
	if len(blk.failing) <= 8 {
		for _, f := range blk.failing {
			for i := range blk.loads {
				if l := &blk.loads[i]; !l.relay && string(l.backend) == string(f) {
					l.failing = true
				}
			}
		}
		return
	}
	failing := make(map[string]bool, len(blk.failing))
	for _, f := range blk.failing {
		failing[string(f)] = true
	}
	for i := range blk.loads {
		if l := &blk.loads[i]; !l.relay && failing[string(l.backend)] {
			l.failing = true
		}
	}
}

// chainList reads a certificate chain, appending to dst.
func (r *reader) chainList(dst [][]byte) ([][]byte, error) {
	n := r.uvarint()
	if r.err || n == 0 || n > maxChainCerts {
		return dst, fmt.Errorf("%w: chain of %d certificates", ErrBadMessage, n)
	}
	for range n {
		c := r.bytes(maxCertLen)
		if r.err || len(c) == 0 {
			return dst, ErrBadMessage
		}
		dst = append(dst, c)
	}
	return dst, nil
}

// reader consumes b; after the first error every read returns zero and err
// stays set.
type reader struct {
	b   []byte
	err bool
}

func (r *reader) uvarint() uint64 {
	if r.err {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte1() byte {
	if r.err || len(r.b) < 1 {
		r.err = true
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) str(limit int) []byte { return r.bytes(min(limit, maxString)) }

// bytes reads a length-prefixed byte string of at most limit bytes.
func (r *reader) bytes(limit int) []byte {
	n := r.uvarint()
	if r.err || n > uint64(limit) || n > uint64(len(r.b)) {
		r.err = true
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

func (r *reader) u64le() uint64 {
	if r.err || len(r.b) < 8 {
		r.err = true
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) float32() float64 {
	if r.err || len(r.b) < 4 {
		r.err = true
		return 0
	}
	v := math.Float32frombits(binary.LittleEndian.Uint32(r.b))
	r.b = r.b[4:]
	// NaN and infinities pass through: the receiver drops such figures
	// and counts them (validEngine).
	return float64(v)
}

func (r *reader) millis() time.Duration {
	v := r.uvarint()
	if v > uint64(math.MaxInt64/int64(time.Millisecond)) {
		r.err = true
		return 0
	}
	return time.Duration(v) * time.Millisecond
}

// Encoding helpers. Each appends to dst and returns it.

func appendHeader(dst []byte, kind byte) []byte {
	return append(dst, wireMagic, wireV1, kind)
}

// appendSignedHead appends the version 2 form of the version 1 message
// msg (one block), without its signature: what the sender signs. The
// signature is then appended to the result.
func appendSignedHead(dst, msg []byte, key keyID, sentAt uint64) []byte {
	dst = append(dst, wireMagic, wireV2, msg[2])
	dst = append(dst, key[:]...)
	dst = binary.AppendUvarint(dst, sentAt)
	return append(dst, msg[3:]...)
}

// appendChain appends a chain: count, then each certificate.
func appendChain(dst []byte, chain [][]byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(chain)))
	for _, c := range chain {
		dst = binary.AppendUvarint(dst, uint64(len(c)))
		dst = append(dst, c...)
	}
	return dst
}

// appendChainMsg appends a chain message from origin.
func appendChainMsg(dst []byte, origin string, chain [][]byte, want bool) []byte {
	dst = append(dst, wireMagic, wireV2, kindChain)
	var flags byte
	if want {
		flags |= chainWant
	}
	dst = append(dst, flags)
	dst = appendString(dst, origin)
	return appendChain(dst, chain)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// appendBlockHead appends the fixed part of a block body.
func appendBlockHead(dst []byte, origin string, instance, seq uint64) []byte {
	dst = appendString(dst, origin)
	dst = binary.AppendUvarint(dst, instance)
	return binary.AppendUvarint(dst, seq)
}

// appendBlock appends a block: its length, then body.
func appendBlock(dst, body []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(body)))
	return append(dst, body...)
}

func appendSection(dst []byte, tag byte, payload []byte) []byte {
	if len(payload) == 0 {
		return dst
	}
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(len(payload)))
	return append(dst, payload...)
}

func appendLoad(dst []byte, backend string, inFlight int64) []byte {
	dst = appendString(dst, backend)
	return binary.AppendVarint(dst, inFlight)
}

func appendHealth(dst []byte, backend string, flags byte) []byte {
	dst = appendString(dst, backend)
	return append(dst, flags)
}

func appendLoadRelay(dst []byte, backend string, inFlight int64, seq uint64, age time.Duration) []byte {
	dst = appendLoad(dst, backend, inFlight)
	dst = binary.AppendUvarint(dst, seq)
	return binary.AppendUvarint(dst, durMillis(age))
}

func appendEngine(dst []byte, backend string, s EngineStats, age time.Duration) []byte {
	dst = appendString(dst, backend)
	flags := s.Known &^ engineOK
	if s.OK {
		flags |= engineOK
	}
	dst = append(dst, flags)
	for _, f := range [4]float64{s.KVUsage, s.Running, s.Waiting, s.PrefixHitRate} {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float32(f)))
	}
	return binary.AppendUvarint(dst, durMillis(age))
}

func durMillis(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64(d / time.Millisecond)
}

// packer splits one node's publish into packets of at most limit bytes,
// each a complete message with the same block head.
type packer struct {
	limit   int
	kind    byte
	head    []byte
	loads   []byte
	engines []byte
	health  []byte
	parts   []byte // a whole tagParts payload
	hot     []byte // a whole tagHot payload
	hotC    []byte // a whole tagHotCounts payload
	cost    []byte // a whole tagCost payload
	block   []byte
	out     [][]byte // packets; their buffers are reused by reset
	n       int      // packets in use
}

func (p *packer) reset(kind byte, origin string, instance, seq uint64) {
	p.kind = kind
	p.head = appendBlockHead(p.head[:0], origin, instance, seq)
	p.loads = p.loads[:0]
	p.engines = p.engines[:0]
	p.health = p.health[:0]
	p.parts = p.parts[:0]
	p.hot = p.hot[:0]
	p.hotC = p.hotC[:0]
	p.cost = p.cost[:0]
	p.n = 0
}

// size is an upper bound of the packet holding the pending sections.
func (p *packer) size() int {
	return 3 + binary.MaxVarintLen32 + len(p.head) + 4*(1+binary.MaxVarintLen32) + len(p.loads) + len(p.engines) + len(p.health) + len(p.parts) + len(p.hot) + len(p.hotC) + len(p.cost)
}

func (p *packer) pending() bool {
	return len(p.loads) > 0 || len(p.engines) > 0 || len(p.parts) > 0 || len(p.hot) > 0 || len(p.hotC) > 0 || len(p.cost) > 0
}

// addLoad appends a tagLoads entry and, when health is not empty, its
// tagHealth entry to the same packet, which the receiver needs to pair
// them.
func (p *packer) addLoad(entry, health []byte) {
	if p.fit(len(entry) + len(health)) {
		p.loads = append(p.loads, entry...)
		p.health = append(p.health, health...)
	}
}

// addEngine appends a tagEngine entry.
func (p *packer) addEngine(entry []byte) {
	if p.fit(len(entry)) {
		p.engines = append(p.engines, entry...)
	}
}

// addParts adds a tagParts payload, whole (a packet holds at most one).
func (p *packer) addParts(payload []byte) {
	if len(p.parts) > 0 {
		p.flush()
	}
	if p.fit(len(payload)) {
		p.parts = append(p.parts, payload...)
	}
}

// addHot adds a tagHot payload, whole (a packet holds at most one).
func (p *packer) addHot(payload []byte) {
	if len(p.hot) > 0 {
		p.flush()
	}
	if p.fit(len(payload)) {
		p.hot = append(p.hot, payload...)
	}
}

// addHotCounts adds a tagHotCounts payload, whole (a packet holds at most
// one).
func (p *packer) addHotCounts(payload []byte) {
	if len(p.hotC) > 0 {
		p.flush()
	}
	if p.fit(len(payload)) {
		p.hotC = append(p.hotC, payload...)
	}
}

// addCost adds a tagCost payload, whole (a packet holds at most one).
func (p *packer) addCost(payload []byte) {
	if len(p.cost) > 0 {
		p.flush()
	}
	if p.fit(len(payload)) {
		p.cost = append(p.cost, payload...)
	}
}

// fit makes room for n more bytes, flushing the pending entries into a
// packet first when they would not fit. It reports false for an entry too
// large for any packet, which is dropped.
func (p *packer) fit(n int) bool {
	if p.size()+n > p.limit {
		if p.pending() {
			p.flush()
		}
		if p.size()+n > p.limit {
			return false
		}
	}
	return true
}

// flush turns the pending sections into a packet (also when empty, which
// makes a bare block: a bye, or a keepalive).
func (p *packer) flush() {
	p.block = append(p.block[:0], p.head...)
	p.block = appendSection(p.block, tagLoads, p.loads)
	p.block = appendSection(p.block, tagEngine, p.engines)
	p.block = appendSection(p.block, tagHealth, p.health)
	if len(p.parts) > 0 {
		p.block = appendSection(p.block, tagParts, p.parts)
	}
	if len(p.hot) > 0 {
		p.block = appendSection(p.block, tagHot, p.hot)
	}
	if len(p.hotC) > 0 {
		p.block = appendSection(p.block, tagHotCounts, p.hotC)
	}
	if len(p.cost) > 0 {
		p.block = appendSection(p.block, tagCost, p.cost)
	}
	if p.n == len(p.out) {
		p.out = append(p.out, nil)
	}
	pkt := appendHeader(p.out[p.n][:0], p.kind)
	pkt = binary.AppendUvarint(pkt, uint64(len(p.block)))
	pkt = append(pkt, p.block...)
	p.out[p.n] = pkt
	p.n++
	p.loads = p.loads[:0]
	p.engines = p.engines[:0]
	p.health = p.health[:0]
	p.parts = p.parts[:0]
	p.hot = p.hot[:0]
	p.hotC = p.hotC[:0]
	p.cost = p.cost[:0]
}

// appendCost appends a tagCost payload of f, its figures clamped to their
// bounds.
func appendCost(dst []byte, f CostFigure) []byte {
	dst = binary.AppendUvarint(dst, min(f.Unit, MaxCostUnit))
	dst = binary.AppendUvarint(dst, min(f.Requests, MaxCostRequests))
	var flags byte
	if f.FromAnswers {
		flags |= costFromAnswers
	}
	return append(dst, flags)
}

// appendHot appends a tagHot payload: the first MaxHotEntries of list
// whose depth is in range.
func appendHot(dst []byte, list []HotPrefix) []byte {
	n := 0
	for _, h := range list {
		if h.Depth >= MaxHotDepth || n == MaxHotEntries {
			continue
		}
		dst = binary.LittleEndian.AppendUint64(dst, h.Key)
		dst = binary.AppendUvarint(dst, uint64(h.Depth))
		n++
	}
	return dst
}

// appendHotCounts appends a tagHotCounts payload: total and partitions,
// then the first MaxHotCounted of list whose depth, count and partition
// are in range.
func appendHotCounts(dst []byte, total uint64, partitions int, list []HotPrefix) []byte {
	total = min(total, MaxHotTotal)
	dst = binary.AppendUvarint(dst, total)
	dst = binary.AppendUvarint(dst, uint64(partitions))
	n := 0
	for _, h := range list {
		if h.Depth >= MaxHotDepth || h.Count > total || uint64(h.Part) >= uint64(partitions) || n == MaxHotCounted {
			continue
		}
		dst = binary.LittleEndian.AppendUint64(dst, h.Key)
		dst = binary.AppendUvarint(dst, uint64(h.Depth))
		dst = binary.AppendUvarint(dst, h.Count)
		dst = binary.AppendUvarint(dst, uint64(h.Part))
		n++
	}
	return dst
}

// appendParts appends a tagParts payload: the partition count, then the
// busiest of loads (at most MaxPartEntries, none below min), busiest
// first.
func appendParts(dst []byte, loads []uint32, min uint32, scratch []PartLoad) ([]byte, []PartLoad) {
	top := scratch[:0]
	for i, c := range loads {
		if c < min || c == 0 {
			continue
		}
		if len(top) < MaxPartEntries {
			top = append(top, PartLoad{Partition: uint32(i), Count: c})
			continue
		}
		// Replace the smallest held (MaxPartEntries is small).
		j := 0
		for k := range top {
			if top[k].Count < top[j].Count {
				j = k
			}
		}
		if c > top[j].Count {
			top[j] = PartLoad{Partition: uint32(i), Count: c}
		}
	}
	slices.SortFunc(top, func(a, b PartLoad) int { return cmp.Compare(b.Count, a.Count) })
	dst = binary.AppendUvarint(dst, uint64(len(loads)))
	for _, e := range top {
		dst = binary.AppendUvarint(dst, uint64(e.Partition))
		dst = binary.AppendUvarint(dst, uint64(e.Count))
	}
	return dst, top
}

// packets returns the finished packets, flushing pending entries.
func (p *packer) packets() [][]byte {
	if p.pending() {
		p.flush()
	}
	return p.out[:p.n]
}
