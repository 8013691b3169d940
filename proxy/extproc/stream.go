package extproc

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Metadata and header names of the contract.
const (
	// NamespaceLB is the metadata namespace of the endpoint keys.
	NamespaceLB = "envoy.lb"
	// NamespaceSubset holds the subset hint.
	NamespaceSubset = "envoy.lb.subset_hint"
	// KeySubset lists the endpoints the pick must come from.
	KeySubset = "x-gateway-destination-endpoint-subset"
	// KeyEndpoint is the picked endpoints, as request header and metadata.
	KeyEndpoint = "x-gateway-destination-endpoint"
	// KeyServed is the endpoint that served, in response metadata.
	KeyServed = "x-gateway-destination-endpoint-served"
)

// chunkSize bounds a re-emitted body piece (Envoy recommends at most 64 KiB).
const chunkSize = 62 << 10

// maxHeaders bounds the header fields read from one message.
const maxHeaders = 256

// Process serves one request's stream.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	select {
	case s.slots <- struct{}{}:
	default:
		// Shed: answer the first message without reading the body.
		if _, err := srv.Recv(); err != nil {
			return nil
		}
		s.m.immediate.WithLabelValues("429").Inc()
		return srv.Send(immediate(typev3.StatusCode_TooManyRequests, "too_many_streams",
			"the endpoint picker has as many requests open as it may; retry later"))
	}
	s.m.streams.Inc()
	defer func() {
		<-s.slots
		s.m.streams.Dec()
	}()
	st := &stream{s: s, srv: srv, charge: s.picker.ChargeBody(),
		msgs: make(chan *extprocv3.ProcessingRequest), errc: make(chan error, 1), done: make(chan struct{})}
	defer st.end()
	go st.read()
	return st.run()
}

// stream is one request's exchange.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer

	// The reader goroutine hands messages over msgs until Recv fails
	// (errc) or the stream ends (done). It ends when the stream's context
	// does, which is when Process returns.
	msgs chan *extprocv3.ProcessingRequest
	errc chan error
	done chan struct{}

	bodyMode, respMode filterv3.ProcessingMode_BodySendMode

	req        proxy.PickRequest
	keyed      bool
	body       []byte
	charge     proxy.BodyCharge
	trailed    bool // the request ended with trailers
	gotHeaders bool
	// headersAnswered: the request headers got their answer before the
	// decision (BUFFERED).
	headersAnswered bool
	picked          *proxy.Picked
}

func (st *stream) read() {
	for {
		m, err := st.srv.Recv()
		if err != nil {
			select {
			case st.errc <- err:
			case <-st.done:
			}
			return
		}
		select {
		case st.msgs <- m:
		case <-st.done:
			return
		}
	}
}

// end gives back what the stream holds.
func (st *stream) end() {
	close(st.done)
	st.dropBody()
	if st.picked != nil {
		st.picked.Release()
	}
}

func (st *stream) dropBody() {
	st.body = nil
	st.charge.Give()
}

// errStreamOver ends run without an error: the gateway closed the stream.
var errStreamOver = errors.New("stream over")

// next waits for the next message until deadline.
func (st *stream) next(deadline time.Time) (*extprocv3.ProcessingRequest, error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case m := <-st.msgs:
		return m, nil
	case err := <-st.errc:
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil, errStreamOver
		}
		return nil, err
	case <-t.C:
		return nil, errDeadline
	}
}

var errDeadline = errors.New("deadline")

func (st *stream) run() error {
	requestDeadline := time.Now().Add(st.s.cfg.ReadTimeout)
	// The request phase: headers, then the body.
	for st.picked == nil {
		m, err := st.next(requestDeadline)
		switch {
		case errors.Is(err, errDeadline):
			st.s.m.immediate.WithLabelValues("408").Inc()
			return st.srv.Send(immediate(typev3.StatusCode_RequestTimeout, "request_timeout", "timed out reading the request"))
		case errors.Is(err, errStreamOver):
			return nil
		case err != nil:
			return err
		}
		done, err := st.request(m)
		if err != nil || done {
			return err
		}
	}
	// The response phase.
	deadline := time.Now().Add(st.s.cfg.FirstByteTimeout)
	for {
		m, err := st.next(deadline)
		switch {
		case errors.Is(err, errDeadline):
			return status.Error(codes.DeadlineExceeded, "no response message in time")
		case errors.Is(err, errStreamOver):
			return nil
		case err != nil:
			return err
		}
		end, err := st.response(m)
		if err != nil || end {
			return err
		}
		deadline = time.Now().Add(st.s.cfg.StreamIdleTimeout)
	}
}

// request handles a message of the request phase; done means the stream
// was answered for good (an immediate response).
func (st *stream) request(m *extprocv3.ProcessingRequest) (done bool, err error) {
	switch v := m.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.gotHeaders {
			return true, status.Error(codes.InvalidArgument, "request headers sent twice")
		}
		st.gotHeaders = true
		if pc := m.GetProtocolConfig(); pc != nil {
			st.bodyMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		} else {
			// No protocol configuration (older data planes): the mode the
			// reference gateways configure.
			st.bodyMode, st.respMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		if st.bodyMode == filterv3.ProcessingMode_STREAMED {
			return true, status.Error(codes.FailedPrecondition,
				"request_body_mode STREAMED is not supported: the decision needs the body before the headers are answered; use FULL_DUPLEX_STREAMED or BUFFERED")
		}
		if resp := st.headers(v.RequestHeaders, m.GetMetadataContext()); resp != nil {
			return true, st.srv.Send(resp)
		}
		if v.RequestHeaders.GetEndOfStream() || st.bodyMode == filterv3.ProcessingMode_NONE {
			return st.decide(nil)
		}
		if st.bodyMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			// BUFFERED: the body comes once the headers are answered; the
			// decision rides on the body's answer.
			st.headersAnswered = true
			return false, st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
				RequestHeaders: &extprocv3.HeadersResponse{}}})
		}
		return false, nil
	case *extprocv3.ProcessingRequest_RequestBody:
		if !st.gotHeaders {
			return true, status.Error(codes.InvalidArgument, "request body before its headers")
		}
		chunk := v.RequestBody.GetBody()
		if len(st.body)+len(chunk) > st.s.cfg.MaxBodySize {
			st.s.m.immediate.WithLabelValues("413").Inc()
			return true, st.srv.Send(immediate(typev3.StatusCode_PayloadTooLarge, "body_too_large",
				"request body exceeds the limit of "+strconv.Itoa(st.s.cfg.MaxBodySize)+" bytes (max-body-size)"))
		}
		if need := len(st.body) + len(chunk); need > cap(st.body) {
			// The buffer grows by doubling, up to the limit, and its
			// whole capacity is charged to the body budget.
			c := min(max(need, 2*cap(st.body), 16<<10), st.s.cfg.MaxBodySize)
			if !st.charge.Take(c - cap(st.body)) {
				st.s.m.immediate.WithLabelValues("429").Inc()
				return true, st.srv.Send(withRetryAfter(immediate(typev3.StatusCode_TooManyRequests, "body_memory_full",
					"the router holds as many request bodies in memory as it may (max-body-memory); retry later")))
			}
			grown := make([]byte, len(st.body), c)
			copy(grown, st.body)
			st.body = grown
		}
		st.body = append(st.body, chunk...)
		// A BUFFERED body comes in one message, whatever its
		// end_of_stream says (trailers may follow once it is answered).
		if !v.RequestBody.GetEndOfStream() && st.bodyMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			return false, nil
		}
		return st.decide(nil)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !st.gotHeaders {
			return true, status.Error(codes.InvalidArgument, "request trailers before headers")
		}
		st.trailed = true
		return st.decide(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return true, status.Errorf(codes.InvalidArgument, "unexpected %T before the request was decided", m.Request)
}

// headers reads the request headers and metadata into st.req. A non-nil
// answer ends the stream (an immediate response).
func (st *stream) headers(h *extprocv3.HttpHeaders, md *corev3.Metadata) *extprocv3.ProcessingResponse {
	session := strings.ToLower(st.s.picker.SessionHeader())
	var path, method string
	fields := h.GetHeaders().GetHeaders()
	if len(fields) > maxHeaders {
		st.s.m.immediate.WithLabelValues("431").Inc()
		return immediate(typev3.StatusCode_RequestHeaderFieldsTooLarge, "headers_too_large", "more than "+strconv.Itoa(maxHeaders)+" header fields")
	}
	for _, f := range fields {
		v := f.GetRawValue()
		if v == nil {
			v = []byte(f.GetValue())
		}
		switch k := f.GetKey(); {
		case k == ":path":
			path = string(v)
		case k == ":method":
			method = string(v)
		case k == tenantHeader:
			st.req.Tenant = v
		case session != "" && k == session:
			st.req.Session = v
		}
	}
	st.req.API, st.keyed = proxy.RouteAPI(path)
	st.keyed = st.keyed && method == "POST"
	st.req.Keyless = !st.keyed
	st.req.Fallbacks = st.s.cfg.Fallbacks
	if sub, ok := subsetHint(md); ok {
		st.req.Subset = sub
	}
	if st.req.Subset != nil && len(st.req.Subset) > proxy.MaxSubset {
		st.s.m.immediate.WithLabelValues("400").Inc()
		return immediate(typev3.StatusCode_BadRequest, "invalid_subset", "the subset hint lists more than "+strconv.Itoa(proxy.MaxSubset)+" endpoints")
	}
	return nil
}

// tenantHeader is proxy.HeaderTenant as the data plane sends it.
var tenantHeader = strings.ToLower(proxy.HeaderTenant)

// subsetHint reads the subset hint: a list of strings (each may itself be
// comma-separated) or one comma-separated string. ok is false when there
// is none; a hint that is present but lists nothing usable is an empty,
// non-nil subset.
func subsetHint(md *corev3.Metadata) (subset []string, ok bool) {
	ns := md.GetFilterMetadata()[NamespaceSubset]
	if ns == nil {
		return nil, false
	}
	v, found := ns.GetFields()[KeySubset]
	if !found {
		return nil, false
	}
	subset = []string{}
	add := func(s string) {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" && len(subset) <= proxy.MaxSubset {
				subset = append(subset, e)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	}
	return subset, true
}

// decide picks, then answers the request phase: the headers (with the
// decision) and, in FULL_DUPLEX_STREAMED, the body re-emitted and then
// tail (the trailers' answer) when not nil. done means the stream ended
// in an immediate response.
func (st *stream) decide(tail *extprocv3.ProcessingResponse) (done bool, err error) {
	if st.keyed {
		st.req.Body = st.body
	}
	pk, err := st.s.picker.Pick(&st.req)
	st.req.Body = nil
	if err != nil {
		st.dropBody()
		code, name := pickError(err)
		st.s.m.immediate.WithLabelValues(strconv.Itoa(int(code))).Inc()
		return true, st.srv.Send(immediate(code, name, err.Error()))
	}
	st.picked = pk
	st.s.m.picks.Inc()
	common, md := decision(pk.Endpoints())
	if st.headersAnswered {
		// BUFFERED: header mutations on the body's answer take effect in
		// that mode, so the decision rides on it.
		st.dropBody()
		return false, st.srv.Send(&extprocv3.ProcessingResponse{DynamicMetadata: md,
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}})
	}
	if err := st.srv.Send(&extprocv3.ProcessingResponse{DynamicMetadata: md,
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
		return true, err
	}
	if st.bodyMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		if err := st.reemit(); err != nil {
			return true, err
		}
	}
	st.dropBody()
	if tail != nil {
		return false, st.srv.Send(tail)
	}
	return false, nil
}

// reemit sends the held body back in chunkSize pieces, the last one with
// end_of_stream unless trailers follow. A request without a body sends
// nothing.
func (st *stream) reemit() error {
	b := st.body
	for len(b) > 0 {
		n := min(len(b), chunkSize)
		last := n == len(b)
		if err := st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
				Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
					Body: b[:n], EndOfStream: last && !st.trailed}}}}}}}); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// decision renders the endpoints as the header mutation and the dynamic
// metadata.
func decision(endpoints []string) (*extprocv3.CommonResponse, *structpb.Struct) {
	v := strings.Join(endpoints, ",")
	common := &extprocv3.CommonResponse{
		ClearRouteCache: true,
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header: &corev3.HeaderValue{Key: KeyEndpoint, RawValue: []byte(v)},
			// A client's own x-gateway-destination-endpoint is replaced,
			// never added to.
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}}},
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		NamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			KeyEndpoint: structpb.NewStringValue(v),
		}}),
	}}
	return common, md
}

// pickError maps a Pick error to the status the HTTP path would answer.
func pickError(err error) (typev3.StatusCode, string) {
	switch {
	case errors.Is(err, proxy.ErrNoEndpoint):
		return typev3.StatusCode_ServiceUnavailable, "no_healthy_backend"
	case errors.Is(err, proxy.ErrModelNotFound):
		return typev3.StatusCode_NotFound, "model_not_found"
	case errors.Is(err, ring.ErrMalformedJSON):
		return typev3.StatusCode_BadRequest, "invalid_json"
	case errors.Is(err, ring.ErrTooDeep):
		return typev3.StatusCode_BadRequest, "json_too_deep"
	case errors.Is(err, ring.ErrBadTenant):
		return typev3.StatusCode_BadRequest, "invalid_prefix_aware_id"
	case errors.Is(err, ring.ErrBadSession):
		return typev3.StatusCode_BadRequest, "invalid_session_id"
	}
	return typev3.StatusCode_BadRequest, "invalid_request"
}

// response handles a message of the response phase; end means the
// exchange is over.
func (st *stream) response(m *extprocv3.ProcessingRequest) (end bool, err error) {
	pk := st.picked
	switch v := m.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		st.served(m.GetMetadataContext())
		var code int
		var ct []byte
		for _, f := range v.ResponseHeaders.GetHeaders().GetHeaders() {
			val := f.GetRawValue()
			if val == nil {
				val = []byte(f.GetValue())
			}
			switch f.GetKey() {
			case ":status":
				code, _ = strconv.Atoi(string(val))
			case "content-type":
				ct = val
			}
		}
		pk.ResponseHeaders(code, ct)
		if err := st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{}}}); err != nil {
			return true, err
		}
		return v.ResponseHeaders.GetEndOfStream(), nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		b := v.ResponseBody.GetBody()
		pk.ResponseBody(b)
		resp := &extprocv3.BodyResponse{}
		if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			// Passed back as it came: nothing of it is kept.
			resp.Response = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
				Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
					Body: b, EndOfStream: v.ResponseBody.GetEndOfStream()}}}}
		}
		if err := st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}}); err != nil {
			return true, err
		}
		return v.ResponseBody.GetEndOfStream(), nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return true, st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_RequestBody, *extprocv3.ProcessingRequest_RequestTrailers:
		// A body piece after the decision (a data plane that sent the
		// body in BUFFERED mode after the headers were answered): passed.
		if rb, ok := v.(*extprocv3.ProcessingRequest_RequestBody); ok {
			return false, st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: passBody(st.bodyMode, rb.RequestBody)}}})
		}
		return false, st.srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return true, status.Errorf(codes.InvalidArgument, "unexpected %T in the response phase", m.Request)
}

// passBody answers a request body piece that arrives after the decision.
func passBody(mode filterv3.ProcessingMode_BodySendMode, b *extprocv3.HttpBody) *extprocv3.CommonResponse {
	if mode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return nil
	}
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}
}

// served reads the served report from the response metadata.
func (st *stream) served(md *corev3.Metadata) {
	v, ok := md.GetFilterMetadata()[NamespaceLB].GetFields()[KeyServed]
	if !ok {
		st.s.m.served.WithLabelValues("missing").Inc()
		return
	}
	ep := strings.TrimSpace(v.GetStringValue())
	if len(ep) > 300 {
		st.s.m.served.WithLabelValues("unknown").Inc()
		st.picked.Served("")
		return
	}
	switch {
	case len(st.picked.Endpoints()) > 0 && ep == st.picked.Endpoints()[0]:
		st.s.m.served.WithLabelValues("primary").Inc()
	case st.picked.Served(ep):
		st.s.m.served.WithLabelValues("fallback").Inc()
	default:
		st.s.m.served.WithLabelValues("unknown").Inc()
	}
}

// immediate is an ImmediateResponse with an OpenAI-style JSON error.
func immediate(code typev3.StatusCode, name, msg string) *extprocv3.ProcessingResponse {
	body := `{"error":{"message":` + strconv.Quote(msg) + `,"type":"` + name + `","code":"` + name + `"}}`
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: code},
		Body:    []byte(body),
		Details: "warmroute_" + name,
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}}},
	}}}
}

func withRetryAfter(r *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	ir := r.GetImmediateResponse()
	ir.Headers.SetHeaders = append(ir.Headers.SetHeaders, &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: "retry-after", RawValue: []byte("1")},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	})
	return r
}
