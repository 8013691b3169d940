package extproc

import (
	"context"
	"encoding/binary"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// fakeStream plays the gateway's side of one stream from a list of
// messages, in process.
type fakeStream struct {
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
	sent int
}

func (f *fakeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(f.msgs) == 0 {
		return nil, io.EOF
	}
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	return m, nil
}
func (f *fakeStream) Send(*extprocv3.ProcessingResponse) error { f.sent++; return nil }
func (f *fakeStream) SetHeader(metadata.MD) error              { return nil }
func (f *fakeStream) SendHeader(metadata.MD) error             { return nil }
func (f *fakeStream) SetTrailer(metadata.MD)                   {}
func (f *fakeStream) Context() context.Context                 { return f.ctx }
func (f *fakeStream) SendMsg(any) error                        { return nil }
func (f *fakeStream) RecvMsg(any) error                        { return nil }

var _ extprocv3.ExternalProcessor_ProcessServer = (*fakeStream)(nil)

// encodeMsgs frames messages as the fuzz input: a 2-byte length, then the
// message.
func encodeMsgs(ms ...*extprocv3.ProcessingRequest) []byte {
	var out []byte
	for _, m := range ms {
		b, _ := proto.Marshal(m)
		out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
		out = append(out, b...)
	}
	return out
}

// FuzzProcess: any sequence of messages a gateway (or anyone on the port)
// sends ends the stream without a panic and leaves no in-flight slot
// held, whatever was decided.
func FuzzProcess(f *testing.F) {
	hdr := func(eos bool, kv ...string) *extprocv3.ProcessingRequest {
		hm := &corev3.HeaderMap{}
		for i := 0; i+1 < len(kv); i += 2 {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}}
	}
	body := func(b string, eos bool) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
	}
	served := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{NamespaceLB: {Fields: map[string]*structpb.Value{
			KeyServed: structpb.NewStringValue("10.0.0.2:8000")}}}}}
	post := []string{":method", "POST", ":path", "/v1/chat/completions"}
	f.Add(encodeMsgs(hdr(false, post...), body(`{"messages":[{"role":"user","content":"hi"}]}`, true), served))
	f.Add(encodeMsgs(hdr(true, ":method", "GET", ":path", "/v1/models")))
	f.Add(encodeMsgs(body("x", true), hdr(false, post...)))
	f.Add(encodeMsgs(hdr(false, post...), hdr(false, post...)))
	f.Add(encodeMsgs(hdr(false, post...), body(`{"messages":[`, true)))
	f.Add([]byte{0, 3, 1, 2, 3})

	pc := proxy.DefaultConfig()
	pc.ProbePath = ""
	pc.MaxBodySize = 4 << 10
	pc.MaxBodyMemory = 1 << 20
	p, err := proxy.New(pc)
	if err != nil {
		f.Fatal(err)
	}
	var bs []ring.Backend
	for _, a := range []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"} {
		bs = append(bs, ring.Backend{ID: a, Addr: "http://" + a, State: ring.Active})
	}
	r, _ := ring.New(ring.DefaultConfig(), bs)
	p.SetRing(r, 1)
	cfg := DefaultConfig()
	cfg.MaxBodySize = int(pc.MaxBodySize)
	cfg.MaxStreams = 1 << 20
	s, err := New(cfg, p)
	if err != nil {
		f.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	f.Fuzz(func(t *testing.T, in []byte) {
		var msgs []*extprocv3.ProcessingRequest
		for len(in) >= 2 && len(msgs) < 16 {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			n = min(n, len(in))
			m := &extprocv3.ProcessingRequest{}
			if proto.Unmarshal(in[:n], m) == nil {
				msgs = append(msgs, m)
			}
			in = in[n:]
		}
		_ = s.Process(&fakeStream{ctx: context.Background(), msgs: msgs})
		for _, l := range p.AppendInFlight(nil) {
			if l.InFlight != 0 {
				t.Fatalf("backend %s holds %d in flight after the stream ended", l.Backend, l.InFlight)
			}
		}
	})
}
