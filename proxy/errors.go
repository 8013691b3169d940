package proxy

import (
	"encoding/json"
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"
)

// errDial: the backend could not be reached; the request was not sent.
var errDial = errors.New("backend unreachable")

// apiError is an OpenAI-style error body.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// errorType maps a status to OpenAI's error type names.
func errorType(status int) string {
	switch {
	case status == fasthttp.StatusUnauthorized:
		return "authentication_error"
	case status == fasthttp.StatusForbidden:
		return "permission_error"
	case status == fasthttp.StatusNotFound:
		return "not_found_error"
	case status == fasthttp.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// writeError writes an OpenAI-style JSON error.
func writeError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: errorType(status), Code: code}})
	ctx.SetBody(b)
}

// ErrorBody renders an OpenAI-style error for other listeners (the admin API).
func ErrorBody(status int, code, msg string) []byte {
	b, _ := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: errorType(status), Code: code}})
	return b
}

// statusText is a small cache of status code strings for metric labels.
var statusText = func() map[int]string {
	m := make(map[int]string)
	for c := 100; c < 600; c++ {
		m[c] = strconv.Itoa(c)
	}
	return m
}()

func statusLabel(code int) string {
	if s, ok := statusText[code]; ok {
		return s
	}
	return strconv.Itoa(code)
}
