package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// Every Raft connection starts with a preamble, after the TLS handshake
// when there is one and before any Raft byte: the dialer says what it
// wants and which cluster its data belongs to, the listener answers with
// its own cluster. Routers whose data belong to different clusters never
// exchange a Raft message, so a router started on another cluster's data
// directory cannot merge the two logs.
//
//	hello  = "WRAFT" version(1) mode(1) len(1) clusterID   (dialer)
//	answer = "WRAFT" version(1) status(1) len(1) clusterID (listener)
//
// mode is modeRaft (Raft RPCs follow) or modeProbe (the dialer only
// checks the peer's identity and cluster, then closes). An empty cluster
// ID is a router that has not learnt its cluster yet: it matches any.
const (
	preambleMagic   = "WRAFT"
	preambleVersion = 1
	// maxClusterID bounds a cluster ID on the wire.
	maxClusterID = 64

	modeRaft  = 'R'
	modeProbe = 'P'

	statusOK      = 0
	statusForeign = 1 // the two clusters differ: both sides close
)

var errPreamble = errors.New("cluster: bad raft preamble")

// appendPreamble appends a hello (b is the mode) or an answer (b is the
// status).
func appendPreamble(dst []byte, b byte, clusterID string) []byte {
	dst = append(dst, preambleMagic...)
	dst = append(dst, preambleVersion, b, byte(len(clusterID)))
	return append(dst, clusterID...)
}

// readPreamble reads a hello or an answer and returns its mode or status
// byte and the cluster ID.
func readPreamble(r io.Reader) (byte, string, error) {
	var hdr [len(preambleMagic) + 3]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, "", err
	}
	return parsePreambleHeader(hdr[:], r)
}

func parsePreambleHeader(hdr []byte, r io.Reader) (byte, string, error) {
	if !bytes.Equal(hdr[:len(preambleMagic)], []byte(preambleMagic)) {
		return 0, "", fmt.Errorf("%w: not a warmroute router (or an older version)", errPreamble)
	}
	rest := hdr[len(preambleMagic):]
	if rest[0] != preambleVersion {
		return 0, "", fmt.Errorf("%w: version %d", errPreamble, rest[0])
	}
	n := int(rest[2])
	if n > maxClusterID {
		return 0, "", fmt.Errorf("%w: cluster id of %d bytes", errPreamble, n)
	}
	id := make([]byte, n)
	if _, err := io.ReadFull(r, id); err != nil {
		return 0, "", err
	}
	if err := checkClusterID(string(id)); err != nil {
		return 0, "", fmt.Errorf("%w: %v", errPreamble, err)
	}
	return rest[1], string(id), nil
}

// checkClusterID accepts "" (not known yet) or lowercase hex of at most
// maxClusterID characters.
func checkClusterID(id string) error {
	if len(id) > maxClusterID {
		return fmt.Errorf("cluster id of %d characters", len(id))
	}
	if !isLowerHex(id) {
		return fmt.Errorf("cluster id %q: lowercase hex only", id)
	}
	return nil
}

// isLowerHex reports whether s holds only 0-9 and a-f.
func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// sameCluster reports whether two routers may talk: either has not learnt
// its cluster yet, or both belong to the same one.
func sameCluster(a, b string) bool { return a == "" || b == "" || a == b }
