package ring

import "errors"

// Sentinel errors. Callers match them with errors.Is; the proxy maps them to
// HTTP statuses.
var (
	// ErrNoBackend: no backend is eligible (none configured, or all unhealthy).
	ErrNoBackend = errors.New("no healthy backend")
	// ErrMalformedJSON: the body is not valid JSON.
	ErrMalformedJSON = errors.New("malformed JSON body")
	// ErrInvalidRequest: valid JSON of the wrong shape (messages not an
	// array, content an object, empty messages, missing prompt, ...).
	ErrInvalidRequest = errors.New("invalid request")
	// ErrBadTenant: the prefix-aware id header is empty, longer than 64
	// characters or holds a non-printable character.
	ErrBadTenant = errors.New("invalid X-Amzn-SageMaker-Prefix-Aware-Id header")
	// ErrBadSession: the session header (Settings.SessionHeader) is
	// empty, too long or holds a non-printable character.
	ErrBadSession = errors.New("invalid session id header")
	// ErrTooDeep: JSON nested deeper than the scanner allows.
	ErrTooDeep = errors.New("JSON nested too deeply")
	// ErrConfig: a Config or backend set that cannot be built.
	ErrConfig = errors.New("invalid ring config")
)
