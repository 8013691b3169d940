// Package eppclient drives an endpoint picker over Envoy's external
// processing protocol the way Envoy does for a Gateway API Inference
// Extension InferencePool: request headers (with the optional subset hint
// in their metadata), the body in pieces, then, once the picker named an
// endpoint, the response headers with the served endpoint in their
// metadata and the response body. The conformance harness in
// cmd/warmroute and the picker's measurements use it; it speaks to any
// picker, warmroute's or another.
package eppclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// Names of the contract.
const (
	KeyEndpoint     = "x-gateway-destination-endpoint"
	KeyServed       = "x-gateway-destination-endpoint-served"
	KeySubset       = "x-gateway-destination-endpoint-subset"
	NamespaceLB     = "envoy.lb"
	NamespaceSubset = "envoy.lb.subset_hint"
)

// Client is a connection to a picker.
type Client struct {
	conn *grpc.ClientConn
	ep   extprocv3.ExternalProcessorClient
}

// Dial connects to addr, over TLS unless plaintext. Like the gateways, it
// does not verify the picker's certificate (the InferencePool names no CA).
func Dial(addr string, plaintext bool) (*Client, error) {
	creds := insecure.NewCredentials()
	if !plaintext {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, ep: extprocv3.NewExternalProcessorClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Health asks the health service about service.
func (c *Client) Health(ctx context.Context, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	r, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return 0, err
	}
	return r.GetStatus(), nil
}

// Request is one request as the gateway sees it.
type Request struct {
	Method, Path string // POST and /v1/chat/completions when empty
	Headers      map[string]string
	Body         []byte
	// ChunkSize splits the body (0: 16 KiB); Gap waits between chunks.
	ChunkSize int
	Gap       time.Duration
	// Subset, when not nil, is sent as the subset hint: a list, or one
	// comma-separated string with SubsetString.
	Subset       []string
	SubsetString bool
	// Mode is the request body mode (0: FULL_DUPLEX_STREAMED).
	Mode filterv3.ProcessingMode_BodySendMode
	// Trailers ends the body with trailers instead of end_of_stream.
	Trailers bool
}

// Answer is what the picker said in the request phase.
type Answer struct {
	// Endpoints is the header's value split; Metadata the dynamic
	// metadata's value (the contract wants them equal).
	Endpoints []string
	Header    string
	Metadata  string
	// ClearRouteCache was set with the decision.
	ClearRouteCache bool
	// Immediate is the status of an immediate response (0: none), with
	// its body and headers.
	Immediate        int
	ImmediateBody    string
	ImmediateHeaders map[string]string
	// Body is the request body the picker passed back.
	Body []byte
	// Kinds lists the answers in the order they came.
	Kinds []string
}

// Exchange is one request's stream, open for the response phase.
type Exchange struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	mode   filterv3.ProcessingMode_BodySendMode
	Answer Answer
}

// ErrNoDecision: the stream ended before the picker answered.
var ErrNoDecision = errors.New("the picker ended the stream without a decision")

// Pick sends req and waits for the picker's decision (or immediate
// response). The exchange stays open until Finish or Reset.
func (c *Client) Pick(ctx context.Context, req *Request) (*Exchange, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.ep.Process(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	x := &Exchange{stream: s, cancel: cancel, mode: req.Mode}
	if x.mode == 0 {
		x.mode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	if err := x.request(req); err != nil {
		x.Reset()
		return nil, err
	}
	return x, nil
}

func headerMap(kv map[string]string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for k, v := range kv {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
	}
	return hm
}

func (x *Exchange) request(req *Request) error {
	method, path := req.Method, req.Path
	if method == "" {
		method = "POST"
	}
	if path == "" {
		path = "/v1/chat/completions"
	}
	h := map[string]string{":method": method, ":path": path, ":scheme": "http", ":authority": "gateway"}
	if len(req.Body) > 0 {
		h["content-type"] = "application/json"
		h["content-length"] = strconv.Itoa(len(req.Body))
	}
	for k, v := range req.Headers {
		h[k] = v
	}
	m := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(h), EndOfStream: len(req.Body) == 0 && !req.Trailers}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: x.mode, ResponseBodyMode: x.mode},
	}
	if req.Subset != nil {
		var v *structpb.Value
		if req.SubsetString {
			v = structpb.NewStringValue(strings.Join(req.Subset, ","))
		} else {
			vals := make([]*structpb.Value, len(req.Subset))
			for i, e := range req.Subset {
				vals[i] = structpb.NewStringValue(e)
			}
			v = structpb.NewListValue(&structpb.ListValue{Values: vals})
		}
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			NamespaceSubset: {Fields: map[string]*structpb.Value{KeySubset: v}}}}
	}
	if err := x.stream.Send(m); err != nil {
		return err
	}
	if x.mode == filterv3.ProcessingMode_BUFFERED && len(req.Body) > 0 {
		// Envoy sends a BUFFERED body once the headers are answered.
		if done, err := x.recv(); err != nil || done {
			return err
		}
		if err := x.sendBody(req, req.Body, true); err != nil {
			return err
		}
	} else if len(req.Body) > 0 || req.Trailers {
		// FULL_DUPLEX_STREAMED: the pieces go as they come, without
		// waiting for answers (which come once the picker decided).
		size := req.ChunkSize
		if size <= 0 {
			size = 16 << 10
		}
		b := req.Body
		for len(b) > 0 {
			n := min(size, len(b))
			if err := x.sendBody(req, b[:n], n == len(b) && !req.Trailers); err != nil {
				return err
			}
			b = b[n:]
			if len(b) > 0 && req.Gap > 0 {
				time.Sleep(req.Gap)
			}
		}
		if req.Trailers {
			if err := x.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
				RequestTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}}}}); err != nil {
				return err
			}
		}
	}
	// Answers until the body (and trailers) came back, or an immediate
	// response.
	for {
		done, err := x.recv()
		if err != nil || done {
			return err
		}
		if x.requestAnswered(req) {
			return nil
		}
	}
}

func (x *Exchange) sendBody(req *Request, b []byte, eos bool) error {
	err := x.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}})
	if errors.Is(err, io.EOF) {
		// The picker answered already (an immediate response): the
		// answer tells.
		return nil
	}
	return err
}

// requestAnswered reports whether every answer of the request phase came.
func (x *Exchange) requestAnswered(req *Request) bool {
	a := &x.Answer
	if x.mode == filterv3.ProcessingMode_BUFFERED && len(req.Body) > 0 {
		return a.Header != ""
	}
	if a.Header == "" {
		return false
	}
	if len(req.Body) > 0 && len(a.Body) < len(req.Body) {
		return false
	}
	if req.Trailers {
		return len(a.Kinds) > 0 && a.Kinds[len(a.Kinds)-1] == "request_trailers"
	}
	return true
}

// recv takes one answer of the request phase; done means an immediate
// response ended the exchange.
func (x *Exchange) recv() (done bool, err error) {
	r, err := x.stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return true, ErrNoDecision
		}
		return true, err
	}
	a := &x.Answer
	switch v := r.Response.(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		a.Kinds = append(a.Kinds, "immediate")
		ir := v.ImmediateResponse
		a.Immediate = int(ir.GetStatus().GetCode())
		a.ImmediateBody = string(ir.GetBody())
		a.ImmediateHeaders = map[string]string{}
		for _, h := range ir.GetHeaders().GetSetHeaders() {
			a.ImmediateHeaders[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
		}
		return true, nil
	case *extprocv3.ProcessingResponse_RequestHeaders:
		a.Kinds = append(a.Kinds, "request_headers")
		a.decision(v.RequestHeaders.GetResponse(), r.GetDynamicMetadata())
	case *extprocv3.ProcessingResponse_RequestBody:
		a.Kinds = append(a.Kinds, "request_body")
		cr := v.RequestBody.GetResponse()
		a.decision(cr, r.GetDynamicMetadata())
		if sr := cr.GetBodyMutation().GetStreamedResponse(); sr != nil {
			a.Body = append(a.Body, sr.GetBody()...)
		}
	case *extprocv3.ProcessingResponse_RequestTrailers:
		a.Kinds = append(a.Kinds, "request_trailers")
	default:
		return true, fmt.Errorf("unexpected answer %T in the request phase", r.Response)
	}
	return false, nil
}

// decision reads the endpoint header and metadata of an answer, if any.
func (a *Answer) decision(cr *extprocv3.CommonResponse, md *structpb.Struct) {
	for _, h := range cr.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == KeyEndpoint {
			a.Header = string(h.GetHeader().GetRawValue())
			a.Endpoints = strings.Split(a.Header, ",")
			a.ClearRouteCache = cr.GetClearRouteCache()
		}
	}
	if v, ok := md.GetFields()[NamespaceLB].GetStructValue().GetFields()[KeyEndpoint]; ok {
		a.Metadata = v.GetStringValue()
	}
}

// Response is the answer the gateway got from the endpoint that served.
type Response struct {
	// Served is reported in the response metadata ("" : no report).
	Served      string
	Status      int
	ContentType string
	// Body pieces, sent in order; the last one ends the stream.
	Body [][]byte
}

// Finish sends the response phase and returns the response body the
// picker passed back; it ends the exchange.
func (x *Exchange) Finish(resp *Response) ([]byte, error) {
	defer x.Reset()
	h := &extprocv3.HttpHeaders{Headers: headerMap(map[string]string{
		":status": strconv.Itoa(resp.Status), "content-type": resp.ContentType}), EndOfStream: len(resp.Body) == 0}
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: h}}
	if resp.Served != "" {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			NamespaceLB: {Fields: map[string]*structpb.Value{KeyServed: structpb.NewStringValue(resp.Served)}}}}
	}
	if err := x.stream.Send(m); err != nil {
		return nil, err
	}
	r, err := x.stream.Recv()
	if err != nil {
		return nil, err
	}
	if r.GetResponseHeaders() == nil {
		return nil, fmt.Errorf("answer %T to the response headers", r.Response)
	}
	var out []byte
	for i, b := range resp.Body {
		if err := x.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: i == len(resp.Body)-1}}}); err != nil {
			return out, err
		}
		r, err := x.stream.Recv()
		if err != nil {
			return out, err
		}
		br := r.GetResponseBody()
		if br == nil {
			return out, fmt.Errorf("answer %T to a response body piece", r.Response)
		}
		out = append(out, br.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
	}
	if err := x.stream.CloseSend(); err != nil {
		return out, err
	}
	if _, err := x.stream.Recv(); !errors.Is(err, io.EOF) {
		return out, fmt.Errorf("the picker did not end the stream after the response: %v", err)
	}
	return out, nil
}

// Reset ends the exchange at once, as a gateway does when its client goes
// away. Safe to call more than once.
func (x *Exchange) Reset() { x.cancel() }

// Raw opens a bare stream, for cases that break the protocol on purpose.
func (c *Client) Raw(ctx context.Context) (extprocv3.ExternalProcessor_ProcessClient, error) {
	return c.ep.Process(ctx)
}
