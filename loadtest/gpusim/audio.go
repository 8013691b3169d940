package gpusim

import (
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"

	"github.com/cespare/xxhash/v2"
)

const (
	// maxFormParts bounds the parts of a multipart audio request, and
	// maxFormField the bytes of each field other than the file.
	maxFormParts = 64
	maxFormField = 64 << 10
	// audioBytesPerWord is how much audio a transcribed word stands for.
	audioBytesPerWord = 2048
)

// serveAudio answers POST /v1/audio/transcriptions and
// /v1/audio/translations: a multipart/form-data body with `file` (the
// audio, read as it streams in and never stored) and optional `model`,
// `response_format` (json or text), `language`, `prompt`, `temperature`.
// The text is filler words, one per audioBytesPerWord bytes of audio (at
// least one, at most DefaultMaxTokens), chosen by a hash of the audio.
func (in *Instance) serveAudio(w http.ResponseWriter, r *http.Request) (any, *apiError) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil, badRequest("The request must be multipart/form-data with a `file` field.")
	}
	mr := multipart.NewReader(http.MaxBytesReader(w, r.Body, in.cfg.MaxRequestBytes), params["boundary"])
	var (
		d         xxhash.Digest
		size      int64
		haveFile  bool
		model     string
		format    = "json"
		streaming bool
	)
	d.Reset()
	for parts := 0; ; parts++ {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, formError(err)
		}
		if parts == maxFormParts {
			return nil, badRequest("gpusim takes at most %d form fields.", maxFormParts)
		}
		name := p.FormName()
		if name == "file" {
			if haveFile {
				return nil, badRequest("file: only one file may be sent.")
			}
			haveFile = true
			if size, err = io.Copy(&d, p); err != nil {
				return nil, formError(err)
			}
			continue
		}
		v, err := io.ReadAll(io.LimitReader(p, maxFormField+1))
		if err != nil {
			return nil, formError(err)
		}
		if len(v) > maxFormField {
			return nil, badRequest("%s: form field exceeds %d bytes.", name, maxFormField)
		}
		switch name {
		case "model":
			model = string(v)
		case "response_format":
			format = string(v)
		case "stream":
			streaming = strings.EqualFold(string(v), "true")
		}
	}
	if !haveFile {
		return nil, validationError("file: Field required")
	}
	if size == 0 {
		return nil, badRequest("The audio file is empty.")
	}
	if format != "json" && format != "text" {
		return nil, &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "response_format",
			message: "Currently only support response_format `text` or `json`"}
	}
	if streaming {
		return nil, &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: "stream",
			message: "gpusim does not stream transcriptions."}
	}
	if _, aerr := in.checkModel(model); aerr != nil {
		return nil, aerr
	}
	n := int(min(1+size/audioBytesPerWord, int64(in.cfg.DefaultMaxTokens)))
	seed := d.Sum64()
	var sb strings.Builder
	for i := 0; i < n; i++ {
		sb.WriteString(in.fill.token(seed, i))
	}
	if format == "text" {
		return answer{contentType: "text/plain; charset=utf-8", body: []byte(sb.String())}, nil
	}
	return struct {
		Text string `json:"text"`
	}{sb.String()}, nil
}

func formError(err error) *apiError {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return bodyError(err)
	}
	return badRequest("There was an error parsing the body: %v", err)
}
