package gossip

import (
	"encoding/json"
	"fmt"
)

// metaMaxSize is memberlist's limit on node metadata.
const metaMaxSize = 512

// encodeMeta encodes m compactly (JSON with one-letter keys) and checks
// memberlist's size limit.
func encodeMeta(m Meta) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("gossip: encode meta: %w", err)
	}
	if len(b) > metaMaxSize {
		return nil, fmt.Errorf("%w (%d bytes)", ErrMetaTooLarge, len(b))
	}
	return b, nil
}

// decodeMeta decodes metadata from another node. Unknown keys are ignored,
// so newer nodes can add fields.
func decodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) == 0 {
		return m, nil
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("gossip: decode meta: %w", err)
	}
	return m, nil
}
