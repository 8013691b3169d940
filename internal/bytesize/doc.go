// Package bytesize is a byte count as settings write it: "32MiB",
// "512KiB", "4096" or "1GB", read by flags (flag.TextVar), YAML and
// WARMROUTE_* variables alike, and written back in the largest binary
// unit that divides it. Counts are bounded to 2^62 so that a setting
// doubled or summed never overflows an int64.
//
// The package imports the standard library only.
package bytesize
