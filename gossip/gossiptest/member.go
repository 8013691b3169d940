package gossiptest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Member is a bare memberlist node that joined a router cluster with the
// gossip key under a name of its choice. Routers send their load packets
// to every member, so it records them: Packets returns a router's publishes,
// ready to replay with Send. It sends nothing but memberlist's own
// traffic.
type Member struct {
	ml  *memberlist.Memberlist
	tr  *tapTransport
	key []byte
}

// maxRecorded bounds the packets a Member keeps (the oldest go first).
const maxRecorded = 10000

// Join starts a Member named name on 127.0.0.1 (a free port) and joins it
// to the router at seed (host:port). key is the cluster's gossip key.
func Join(key []byte, name, seed string) (*Member, error) {
	inner, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"},
		Logger:    log.New(io.Discard, "", 0),
	})
	if err != nil {
		return nil, err
	}
	tr := &tapTransport{NetTransport: inner, packets: make(chan *memberlist.Packet), done: make(chan struct{})}
	tr.wg.Add(1)
	go tr.run()
	mc := memberlist.DefaultLANConfig()
	mc.Name = name
	mc.BindAddr = "127.0.0.1"
	mc.BindPort = inner.GetAutoBindPort()
	mc.AdvertisePort = mc.BindPort
	mc.Transport = tr
	mc.Logger = log.New(io.Discard, "", 0)
	if len(key) > 0 {
		if mc.Keyring, err = memberlist.NewKeyring(nil, key); err != nil {
			_ = tr.Shutdown()
			return nil, err
		}
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = tr.Shutdown()
		return nil, err
	}
	if _, err := ml.Join([]string{seed}); err != nil {
		_ = ml.Shutdown()
		return nil, fmt.Errorf("gossiptest: join %s: %w", seed, err)
	}
	return &Member{ml: ml, tr: tr, key: key}, nil
}

// Packets returns copies of the publishes received so far from origin
// (load packets of kind publish, signed or not), oldest first.
func (m *Member) Packets(origin string) [][]byte {
	m.tr.mu.Lock()
	defer m.tr.mu.Unlock()
	var out [][]byte
	for _, p := range m.tr.recorded {
		msg, err := Open(m.key, p)
		if err == nil && len(msg) >= 3 && msg[2] == kindPublish && originOf(msg) == origin {
			out = append(out, bytes.Clone(p))
		}
	}
	return out
}

// originOf returns the origin of a version 1 or 2 message's block, or "".
func originOf(msg []byte) string {
	b := msg[3:]
	if msg[1] == versionV2 {
		if len(b) < 16 {
			return ""
		}
		b = b[16:]
		if _, n := binary.Uvarint(b); n > 0 {
			b = b[n:] // sent at
		}
	}
	if _, n := binary.Uvarint(b); n > 0 {
		b = b[n:] // block length
	}
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return ""
	}
	return string(b[n : n+int(l)])
}

// Close leaves the cluster (bounded by a second) and stops the Member.
func (m *Member) Close() error {
	_ = m.ml.Leave(time.Second)
	return m.ml.Shutdown()
}

// tapTransport is memberlist's NetTransport with load packets (first byte
// 0x57, which no memberlist packet starts with) taken out and recorded.
type tapTransport struct {
	*memberlist.NetTransport
	packets  chan *memberlist.Packet
	done     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	mu       sync.Mutex
	recorded [][]byte
}

func (t *tapTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *tapTransport) run() {
	defer t.wg.Done()
	in := t.NetTransport.PacketCh()
	for {
		select {
		case <-t.done:
			return
		case p := <-in:
			if len(p.Buf) > 0 && p.Buf[0] == magic {
				t.mu.Lock()
				if len(t.recorded) == maxRecorded {
					t.recorded = t.recorded[1:]
				}
				t.recorded = append(t.recorded, p.Buf)
				t.mu.Unlock()
				continue
			}
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		}
	}
}

// Shutdown stops the inner transport and the forwarding goroutine.
func (t *tapTransport) Shutdown() error {
	err := t.NetTransport.Shutdown()
	t.stopOnce.Do(func() { close(t.done) })
	t.wg.Wait()
	return err
}
