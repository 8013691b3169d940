package gossip

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// Wire format, version 1. All integers are varints (encoding/binary);
// strings are a uvarint length then the bytes.
//
//	message = magic(0x57) version(1) kind block*
//	block   = uvarint(len) origin:string instance:uvarint seq:uvarint section*
//	section = tag:byte uvarint(len) entry*
//
//	tagLoads      entry = backend:string inFlight:varint
//	tagEngine     entry = backend:string flags:byte kv,run,wait,hit:float32le scrapeAgeMs:uvarint
//	tagLoadsRelay entry = backend:string inFlight:varint seq:uvarint ageMs:uvarint
//	tagHealth     entry = backend:string flags:byte (healthFailing: the sender sees it failing)
//
// A kindPublish message carries one block from its sender; figures in a
// tagLoads section carry the block's seq and are fresh. A kindState
// message (memberlist push/pull) carries the sender's own block plus one
// relay block per other node it knows, whose tagLoadsRelay entries carry
// their own seq and age. A tagHealth section marks backends of the same
// block's tagLoads section that the sender sees failing (its own health
// checks or passive ejection); a tagLoads entry without one is healthy,
// and relayed figures say nothing about health. A kindBye message is a block without sections:
// its sender is leaving and its figures must be dropped now.
//
// instance identifies one run of a node (its start time in nanoseconds);
// seq counts publishes within a run. (instance, seq) orders figures from
// one node. Sections with unknown tags are skipped, so a later version can
// add per-backend fields (such as local health) without breaking older
// nodes; a new version byte is only for incompatible changes.
const (
	wireMagic   = 0x57
	wireVersion = 1

	kindPublish = 1
	kindState   = 2
	kindBye     = 3

	tagLoads      = 1
	tagEngine     = 2
	tagLoadsRelay = 3
	tagHealth     = 4

	// maxString bounds node names and backend ids on the wire.
	maxString = 1024
	// maxPacket bounds one UDP payload so that, with memberlist's framing
	// (message type, CRC) and AES-GCM overhead, a packet stays below the
	// usual 1500-byte MTU and memberlist's 1400-byte UDP buffer.
	maxPacket = 1300

	engineOK = 0x80

	healthFailing = 0x01
)

// Engine metric bits in EngineStats.Known.
const (
	EngineKVUsage uint8 = 1 << iota
	EngineRunning
	EngineWaiting
	EnginePrefixHitRate
)

type wireMsg struct {
	kind   byte
	blocks []wireBlock
}

type wireBlock struct {
	origin   []byte
	instance uint64
	seq      uint64
	loads    []wireLoad
	engines  []wireEngine
	failing  [][]byte // backends of loads the origin sees failing
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
// into b.
func (m *wireMsg) decode(b []byte) error {
	m.blocks = m.blocks[:0]
	if len(b) < 3 || b[0] != wireMagic {
		return ErrBadMessage
	}
	if b[1] != wireVersion {
		return ErrUnknownVersion
	}
	m.kind = b[2]
	if m.kind < kindPublish || m.kind > kindBye {
		return fmt.Errorf("%w: kind %d", ErrBadMessage, m.kind)
	}
	r := reader{b: b[3:]}
	for len(r.b) > 0 {
		n := r.uvarint()
		if r.err || n > uint64(len(r.b)) {
			return ErrBadMessage
		}
		body := reader{b: r.b[:n]}
		r.b = r.b[n:]
		if len(m.blocks) < cap(m.blocks) {
			m.blocks = m.blocks[:len(m.blocks)+1]
		} else {
			m.blocks = append(m.blocks, wireBlock{})
		}
		blk := &m.blocks[len(m.blocks)-1]
		if err := blk.decode(&body); err != nil {
			return err
		}
	}
	if m.kind != kindState && len(m.blocks) != 1 {
		return fmt.Errorf("%w: %d blocks", ErrBadMessage, len(m.blocks))
	}
	return nil
}

func (blk *wireBlock) decode(r *reader) error {
	blk.loads = blk.loads[:0]
	blk.engines = blk.engines[:0]
	blk.failing = blk.failing[:0]
	blk.origin = r.str()
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
			for len(sec.b) > 0 {
				l := wireLoad{backend: sec.str(), inFlight: sec.varint(), seq: blk.seq}
				if tag == tagLoadsRelay {
					l.relay = true
					l.seq = sec.uvarint()
					l.age = sec.millis()
				}
				if sec.err || len(l.backend) == 0 {
					return ErrBadMessage
				}
				blk.loads = append(blk.loads, l)
			}
		case tagEngine:
			for len(sec.b) > 0 {
				e := wireEngine{backend: sec.str()}
				flags := sec.byte1()
				e.stats.OK = flags&engineOK != 0
				e.stats.Known = flags &^ engineOK
				e.stats.KVUsage = sec.float32()
				e.stats.Running = sec.float32()
				e.stats.Waiting = sec.float32()
				e.stats.PrefixHitRate = sec.float32()
				e.age = sec.millis()
				if sec.err || len(e.backend) == 0 {
					return ErrBadMessage
				}
				blk.engines = append(blk.engines, e)
			}
		case tagHealth:
			for len(sec.b) > 0 {
				backend, flags := sec.str(), sec.byte1()
				if sec.err || len(backend) == 0 {
					return ErrBadMessage
				}
				if flags&healthFailing != 0 {
					blk.failing = append(blk.failing, backend)
				}
			}
		default:
			// A section from a later version: skip it.
		}
	}
	// Health applies to the block's own (not relayed) figures, whatever
	// the order of the sections.
	for _, f := range blk.failing {
		for i := range blk.loads {
			if l := &blk.loads[i]; !l.relay && string(l.backend) == string(f) {
				l.failing = true
			}
		}
	}
	return nil
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

func (r *reader) str() []byte {
	n := r.uvarint()
	if r.err || n > maxString || n > uint64(len(r.b)) {
		r.err = true
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

func (r *reader) float32() float64 {
	if r.err || len(r.b) < 4 {
		r.err = true
		return 0
	}
	v := math.Float32frombits(binary.LittleEndian.Uint32(r.b))
	r.b = r.b[4:]
	f := float64(v)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
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
	return append(dst, wireMagic, wireVersion, kind)
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
	p.n = 0
}

// size is an upper bound of the packet holding the pending sections.
func (p *packer) size() int {
	return 3 + binary.MaxVarintLen32 + len(p.head) + 3*(1+binary.MaxVarintLen32) + len(p.loads) + len(p.engines) + len(p.health)
}

func (p *packer) pending() bool { return len(p.loads) > 0 || len(p.engines) > 0 }

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
}

// packets returns the finished packets, flushing pending entries.
func (p *packer) packets() [][]byte {
	if p.pending() {
		p.flush()
	}
	return p.out[:p.n]
}
