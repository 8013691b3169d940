package hostname

import "net/netip"

// maxLen bounds a DNS name: 253 characters written out (RFC 1035).
const maxLen = 253

// Valid reports whether h can name a host to dial: an IP address (an IPv6
// zone included) or a DNS name of 1-253 letters, digits, '-', '_' and '.'.
func Valid(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if h == "" || len(h) > maxLen {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
