package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/node/admin"
)

// The cluster CA and router certificates that 'warmroute tls' makes.
//
// Validity defaults: the CA lives 10 years because replacing it means
// issuing every router a new certificate and restarting the whole cluster,
// while its key is kept offline and used only to sign. A router certificate
// lives 1 year: replacing one is a restart of one router, and expiry ends
// a stolen key that nobody revoked ('warmroute tls revoke').
const (
	caFileName      = "warmroute-ca.pem"
	caKeyFileName   = "warmroute-ca-key.pem"
	defaultCADays   = 3650
	defaultCertDays = 365
	defaultCAName   = "warmroute cluster CA"
	maxDays         = 36500 // 100 years; also keeps days*24h inside time.Duration
	maxCertNames    = 1000  // routers per 'cert create'
	maxSANs         = 100   // DNS names, and IP addresses, per certificate
	maxShowBytes    = 1 << 20
	maxShowCerts    = 16
	namePlaceholder = "{name}"
)

// cmdTLS creates the cluster CA and router certificates, shows what a
// certificate proves, and keeps the cluster's revocation list: 'warmroute
// tls ca create', 'cert create', 'show', 'revoke' and 'unrevoke'.
func cmdTLS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		tlsUsage(stderr)
		return errors.New("missing subcommand: ca create, cert create, show, revoke or unrevoke")
	}
	sub := args[0]
	if len(args) > 1 && (sub == "ca" || sub == "cert") {
		sub += " " + args[1]
	}
	switch sub {
	case "-h", "-help", "--help", "help":
		tlsUsage(stdout)
		return flag.ErrHelp
	case "ca create":
		o, err := parseCACreate(args[2:], stderr)
		if err != nil {
			return err
		}
		return tlsCACreate(o, stdout)
	case "cert create":
		o, err := parseCertCreate(args[2:], stderr)
		if err != nil {
			return err
		}
		return tlsCertCreate(o, stdout)
	case "show":
		o, err := parseShow(args[1:], stderr)
		if err != nil {
			return err
		}
		return tlsShow(o, stdout)
	case "revoke", "unrevoke":
		return tlsRevoke(ctx, sub == "unrevoke", args[1:], stdout, stderr)
	case "ca", "cert":
		tlsUsage(stderr)
		return fmt.Errorf("%s: missing action (want '%s create')", sub, sub)
	}
	tlsUsage(stderr)
	return fmt.Errorf("unknown subcommand %q (want ca create, cert create, show, revoke or unrevoke)", strings.Join(args[:min(2, len(args))], " "))
}

func tlsUsage(w io.Writer) {
	fmt.Fprintf(w, `usage: warmroute tls ca create   [--dir DIR] [--days N] [--name CN]
       warmroute tls cert create --name ROUTER [--name ROUTER]... [--names R1,R2,...]
                                 [--dns NAME]... [--ip IP]... [--dir DIR]
                                 [--ca FILE] [--ca-key FILE] [--days N]
       warmroute tls show [--ca FILE] [--name ROUTER] FILE
       warmroute tls revoke|unrevoke [--name ROUTER]... [--serial HEX]... [--cert FILE]...
                                 [--admin URL] [--ca-file FILE] [--token-file FILE]
       warmroute tls revoke --list [--admin URL] [--ca-file FILE] [--token-file FILE]

Routers talk to each other (Raft, forwarded admin writes) over mutual TLS.
Each router proves its name with a certificate signed by the cluster's own
CA that carries the URI SAN %[1]s<name>; its --node-name must be
that name. These commands make the CA (in a directory of its own, kept
offline) and the router certificates (in another, whose files go to the
routers):

  warmroute tls ca create --dir ca
  warmroute tls cert create --ca ca/%[2]s --dir tls --names r1,r2,r3
  cp ca/%[2]s tls/     # the CA certificate only: ca/ stays offline
  warmroute serve --node-name r1 --cluster-tls-cert-file tls/r1.pem \
    --cluster-tls-key-file tls/r1-key.pem --cluster-tls-ca-file tls/%[2]s ...

Files are never overwritten. Keep %[3]s offline: whoever holds it
can make a certificate for any router name. Each router needs its own
certificate and key, and a copy of %[2]s (the certificate alone).

A router retired, or whose key leaked, is revoked through any router's
admin API: 'warmroute tls revoke --name r2' (or --serial, as 'tls show'
prints it). The list is agreed through Raft; every router then refuses
that certificate.

Run 'warmroute tls ca create --help' (or 'cert create', 'show', 'revoke') for the flags.
`, identity.URNPrefix, caFileName, caKeyFileName)
}

// multiFlag is a listFlag whose uses add up: a repeatable flag, each
// value of which may also be a comma-separated list.
type multiFlag listFlag

func (f multiFlag) String() string { return listFlag(f).String() }

func (f multiFlag) Set(v string) error {
	*f.dst = append(*f.dst, splitList(v)...)
	return nil
}

// parseFlags parses args allowing flags after positional arguments
// ('show FILE --ca ca.pem') and returns the positional ones.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func checkDays(flagName string, days int) error {
	if days < 1 || days > maxDays {
		return fmt.Errorf("--%s %d: want 1 to %d", flagName, days, maxDays)
	}
	return nil
}

// caCreateOpts are the settings of 'tls ca create'.
type caCreateOpts struct {
	dir  string
	days int
	name string
}

func (o caCreateOpts) certFile() string { return filepath.Join(o.dir, caFileName) }
func (o caCreateOpts) keyFile() string  { return filepath.Join(o.dir, caKeyFileName) }

func parseCACreate(args []string, stderr io.Writer) (caCreateOpts, error) {
	o := caCreateOpts{dir: ".", days: defaultCADays, name: defaultCAName}
	fs := flag.NewFlagSet("warmroute tls ca create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dir, "dir", o.dir, "directory to write "+caFileName+" and "+caKeyFileName+" to (created if missing)")
	fs.IntVar(&o.days, "days", o.days, "days the CA is valid (router certificates it signs never outlive it)")
	fs.StringVar(&o.name, "name", o.name, "the CA's common name (shown by 'warmroute tls show')")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: warmroute tls ca create [flags]\n\nCreate the cluster CA: a self-signed ECDSA P-256 certificate (%s) and its\nprivate key (%s, mode 0600). Existing files are never overwritten.\nThe default validity is 10 years: replacing the CA means a new certificate for\nevery router, and the key is used only to sign, kept offline.\n\n", caFileName, caKeyFileName)
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return o, err
	}
	if len(pos) > 0 {
		return o, fmt.Errorf("ca create: unexpected arguments %q", pos)
	}
	if err := checkDays("days", o.days); err != nil {
		return o, err
	}
	if o.name = strings.TrimSpace(o.name); o.name == "" || len(o.name) > 64 || strings.IndexFunc(o.name, notPrintable) >= 0 {
		return o, fmt.Errorf("--name %q: want 1-64 printable characters", o.name)
	}
	if o.dir == "" {
		return o, errors.New("--dir is empty")
	}
	return o, nil
}

func notPrintable(r rune) bool { return !unicode.IsPrint(r) }

func tlsCACreate(o caCreateOpts, stdout io.Writer) error {
	if err := refuseExisting(o.certFile(), o.keyFile()); err != nil {
		return err
	}
	ca, err := identity.NewCA(o.name, time.Duration(o.days)*24*time.Hour)
	if err != nil {
		return err
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	if err := writeNewFiles(o.dir, []newFile{
		{o.keyFile(), keyPEM, 0o600},
		{o.certFile(), ca.CertPEM(), 0o644},
	}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s  (the CA certificate, %q, valid until %s: every router's --cluster-tls-ca-file)\n",
		o.certFile(), o.name, ca.Cert.NotAfter.UTC().Format(time.DateOnly))
	fmt.Fprintf(stdout, "wrote %s  (its private key, mode 0600: keep it offline; it signs router certificates)\n\n", o.keyFile())
	// The router keys go to another directory: this one holds the CA
	// key, which stays offline while the router files are shipped.
	out := routerDirFor(o.dir)
	fmt.Fprintf(stdout, "next: a certificate for each router, named as its --node-name, in a directory of its own (%s keeps the CA key, offline):\n  warmroute tls cert create --ca %s --dir %s --name <router>\n",
		shellQuote(o.dir), shellQuote(o.certFile()), shellQuote(out))
	fmt.Fprintf(stdout, "then give each router its two files from %s and a copy of %s (the certificate, never the key).\n", shellQuote(out), shellQuote(o.certFile()))
	return nil
}

// routerDirFor is the directory the hints suggest for router files: a
// sibling of the CA's directory.
func routerDirFor(caDir string) string {
	parent := filepath.Dir(filepath.Clean(caDir))
	if filepath.Clean(caDir) == "." {
		return "router-tls"
	}
	return filepath.Join(parent, "router-tls")
}

// certCreateOpts are the settings of 'tls cert create'.
type certCreateOpts struct {
	dir, caFile, caKeyFile string
	days                   int
	names                  []string
	dns                    []string // may contain {name}
	ips                    []net.IP
}

func (o certCreateOpts) certFile(name string) string { return filepath.Join(o.dir, name+".pem") }
func (o certCreateOpts) keyFile(name string) string  { return filepath.Join(o.dir, name+"-key.pem") }

func parseCertCreate(args []string, stderr io.Writer) (certCreateOpts, error) {
	o := certCreateOpts{dir: ".", days: defaultCertDays}
	var ips []string
	fs := flag.NewFlagSet("warmroute tls cert create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(multiFlag{&o.names}, "name", "router name, as its --node-name (repeat, or a comma-separated list, for several routers)")
	fs.Var(multiFlag{&o.names}, "names", "comma-separated router names (same as several --name)")
	fs.Var(multiFlag{&o.dns}, "dns", "DNS name to add as a SAN, for clients that check host names (Prometheus); "+namePlaceholder+" is replaced by the router name; repeatable")
	fs.Var(multiFlag{&ips}, "ip", "IP address to add as a SAN; repeatable")
	fs.StringVar(&o.dir, "dir", o.dir, "directory to write ROUTER.pem and ROUTER-key.pem to (created if missing)")
	fs.StringVar(&o.caFile, "ca", "", "CA certificate (default DIR/"+caFileName+")")
	fs.StringVar(&o.caKeyFile, "ca-key", "", "CA private key (default: the --ca file's name with -key.pem for .pem, e.g. DIR/"+caKeyFileName+")")
	fs.IntVar(&o.days, "days", o.days, "days the certificate is valid (at most as long as the CA)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: warmroute tls cert create --name ROUTER [flags]

Create a router's key (ECDSA P-256, ROUTER-key.pem, mode 0600) and its
certificate (ROUTER.pem) signed by the cluster CA, naming the router in the
URI SAN %s<ROUTER>. ROUTER must be the router's --node-name.
Routers do not check host names, so --dns and --ip are only for other clients
(Prometheus scraping the HTTPS admin API). The default validity is 1 year;
'warmroute tls revoke' ends a certificate sooner. Write router files to a
directory other than the CA key's (--ca names the CA): the CA key stays
offline. Existing files are never overwritten; with several names either all
are written or none.

`, identity.URNPrefix)
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return o, err
	}
	if len(pos) > 0 {
		return o, fmt.Errorf("cert create: unexpected arguments %q (router names go in --name)", pos)
	}
	if len(o.names) == 0 {
		return o, errors.New("cert create: --name is required (the router's --node-name)")
	}
	if len(o.names) > maxCertNames {
		return o, fmt.Errorf("cert create: %d names, at most %d at once", len(o.names), maxCertNames)
	}
	seen := map[string]bool{}
	for _, n := range o.names {
		if err := identity.CheckName(n); err != nil {
			return o, fmt.Errorf("--name: %w", err)
		}
		if n == strings.TrimSuffix(caFileName, ".pem") || n == strings.TrimSuffix(caKeyFileName, ".pem") {
			return o, fmt.Errorf("--name %q: reserved for the CA's files", n)
		}
		if seen[n] {
			return o, fmt.Errorf("--name %q given twice", n)
		}
		seen[n] = true
	}
	if len(o.dns) > maxSANs || len(ips) > maxSANs {
		return o, fmt.Errorf("cert create: at most %d --dns and %d --ip", maxSANs, maxSANs)
	}
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil || ip.IsUnspecified() {
			return o, fmt.Errorf("--ip %q: not a usable IP address", s)
		}
		o.ips = append(o.ips, ip)
	}
	if err := checkDays("days", o.days); err != nil {
		return o, err
	}
	if o.dir == "" {
		return o, errors.New("--dir is empty")
	}
	if o.caFile == "" {
		o.caFile = filepath.Join(o.dir, caFileName)
	}
	if o.caKeyFile == "" {
		base, ok := strings.CutSuffix(o.caFile, ".pem")
		if !ok {
			return o, fmt.Errorf("--ca %s does not end in .pem: give --ca-key too", o.caFile)
		}
		o.caKeyFile = base + "-key.pem"
	}
	if _, err := o.requests(); err != nil {
		return o, err
	}
	return o, nil
}

// expandDNS replaces {name} in a --dns value with the router name and
// checks the result is a host name.
func expandDNS(tmpl, name string) (string, error) {
	d := strings.ReplaceAll(tmpl, namePlaceholder, name)
	if strings.ContainsAny(d, "{}") {
		return "", fmt.Errorf("--dns %q: the only placeholder is %s", tmpl, namePlaceholder)
	}
	if err := checkHostName(d); err != nil {
		return "", fmt.Errorf("--dns %q: %w", tmpl, err)
	}
	return strings.ToLower(d), nil
}

// checkHostName accepts a DNS host name: dot-separated labels of 1-63
// letters, digits and '-', not starting or ending with '-', 253 bytes in
// all; a trailing dot is refused (certificates carry names without it).
func checkHostName(s string) error {
	if s == "" || len(s) > 253 {
		return errors.New("want 1-253 characters")
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("label %q: want 1-63 characters", label)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with '-'", label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("label %q: letters, digits and '-' only", label)
			}
		}
	}
	return nil
}

// requests builds the certificate request of each router.
func (o certCreateOpts) requests() ([]identity.Request, error) {
	out := make([]identity.Request, 0, len(o.names))
	for _, n := range o.names {
		r := identity.Request{Name: n, IPs: o.ips, Validity: time.Duration(o.days) * 24 * time.Hour}
		seen := map[string]bool{}
		for _, d := range o.dns {
			e, err := expandDNS(d, n)
			if err != nil {
				return nil, fmt.Errorf("router %s: %w", n, err)
			}
			if !seen[e] {
				seen[e] = true
				r.DNSNames = append(r.DNSNames, e)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

func tlsCertCreate(o certCreateOpts, stdout io.Writer) error {
	reqs, err := o.requests()
	if err != nil {
		return err
	}
	var paths []string
	for _, n := range o.names {
		paths = append(paths, o.certFile(n), o.keyFile(n))
	}
	if err := refuseExisting(paths...); err != nil {
		return err
	}
	ca, err := identity.LoadCA(o.caFile, o.caKeyFile)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w\n(create the CA first: warmroute tls ca create --dir %s; or name it with --ca and --ca-key)", err, shellQuote(filepath.Dir(o.caFile)))
		}
		return err
	}
	if !time.Now().Before(ca.Cert.NotAfter) {
		return fmt.Errorf("the CA %s expired on %s: create a new CA and certificates for every router", o.caFile, ca.Cert.NotAfter.UTC().Format(time.DateOnly))
	}
	var files []newFile
	var until time.Time
	for _, r := range reqs {
		certPEM, keyPEM, err := ca.Issue(r)
		if err != nil {
			return fmt.Errorf("router %s: %w", r.Name, err)
		}
		blk, _ := pem.Decode(certPEM)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return fmt.Errorf("router %s: %w", r.Name, err)
		}
		until = c.NotAfter
		files = append(files, newFile{o.keyFile(r.Name), keyPEM, 0o600}, newFile{o.certFile(r.Name), certPEM, 0o644})
	}
	if err := writeNewFiles(o.dir, files); err != nil {
		return err
	}
	var notes []string
	if until.Equal(ca.Cert.NotAfter) {
		notes = append(notes, fmt.Sprintf("note: the CA expires on %s, so the certificates do too (asked for %d days)",
			until.UTC().Format(time.DateOnly), o.days))
	}
	for _, r := range reqs {
		sans := []string{identity.URNPrefix + r.Name}
		sans = append(sans, r.DNSNames...)
		for _, ip := range r.IPs {
			sans = append(sans, ip.String())
		}
		fmt.Fprintf(stdout, "wrote %s  (router %s, valid until %s; SANs %s)\n", o.certFile(r.Name), r.Name,
			until.UTC().Format(time.DateOnly), strings.Join(sans, ", "))
		fmt.Fprintf(stdout, "wrote %s  (its private key, mode 0600: only router %s needs it)\n", o.keyFile(r.Name), r.Name)
	}
	if sameDir(o.dir, filepath.Dir(o.caKeyFile)) {
		notes = append(notes, fmt.Sprintf("note: %s also holds the CA key %s: copy only the router files out of it, and keep the CA key offline "+
			"(next time write router files elsewhere: --ca %s --dir <other directory>)", shellQuote(o.dir), shellQuote(o.caKeyFile), shellQuote(o.caFile)))
	}
	for _, n := range notes {
		fmt.Fprintln(stdout, n)
	}
	n := o.names[0]
	fmt.Fprintf(stdout, "\nnext: start the router with its name and these files, e.g.\n  warmroute serve --node-name %s --cluster-tls-cert-file %s --cluster-tls-key-file %s --cluster-tls-ca-file %s ...\n",
		n, shellQuote(o.certFile(n)), shellQuote(o.keyFile(n)), shellQuote(o.caFile))
	fmt.Fprintf(stdout, "(or WARMROUTE_NODE_NAME, WARMROUTE_CLUSTER_TLS_CERT_FILE, _KEY_FILE and _CA_FILE); check a file with: warmroute tls show %s\n",
		shellQuote(o.certFile(n)))
	return nil
}

// sameDir reports whether a and b name the same directory.
func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// newFile is a file to create; it must not exist yet.
type newFile struct {
	path string
	data []byte
	mode os.FileMode
}

// refuseExisting fails when any of paths exists (a dangling symlink
// included).
func refuseExisting(paths ...string) error {
	var found []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			found = append(found, p)
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	switch len(found) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("refusing to overwrite %s: move or remove it first", found[0])
	}
	return fmt.Errorf("refusing to overwrite %s: move or remove them first", strings.Join(found, ", "))
}

// writeNewFiles creates dir (0700) when missing and writes every file
// with O_EXCL; on any failure the files written so far are removed, so
// either all are written or none.
func writeNewFiles(dir string, files []newFile) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var done []string
	defer func() {
		if err != nil {
			for _, p := range done {
				os.Remove(p)
			}
		}
	}()
	for _, f := range files {
		if err := writeNew(f); err != nil {
			return err
		}
		done = append(done, f.path)
	}
	return nil
}

func writeNew(f newFile) error {
	fh, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("refusing to overwrite %s: move or remove it first", f.path)
		}
		return err
	}
	_, err = fh.Write(f.data)
	if serr := fh.Sync(); err == nil {
		err = serr
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.path)
	}
	return err
}

// shellQuote quotes s for a shell command line when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,+@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// showOpts are the settings of 'tls show'.
type showOpts struct {
	file, caFile, name string
}

func parseShow(args []string, stderr io.Writer) (showOpts, error) {
	var o showOpts
	fs := flag.NewFlagSet("warmroute tls show", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.caFile, "ca", "", "also check that the certificate is signed by this CA and valid now (exit 1 if not)")
	fs.StringVar(&o.name, "name", "", "also check that the certificate proves this router name (exit 1 if not)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: warmroute tls show [flags] FILE\n\nPrint the router name a certificate proves (its %s URI SAN), its\nsubject, issuer, SANs and validity. FILE may hold several certificates (a chain\nor a CA bundle); private keys in it are skipped, never printed.\n\n", identity.URNPrefix)
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return o, err
	}
	if len(pos) != 1 {
		fs.Usage()
		return o, errors.New("show: want one certificate file")
	}
	o.file = pos[0]
	if o.name != "" {
		if err := identity.CheckName(o.name); err != nil {
			return o, fmt.Errorf("--name: %w", err)
		}
	}
	return o, nil
}

// readBounded reads at most maxShowBytes of a file.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxShowBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxShowBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes; not a certificate file", path, maxShowBytes)
	}
	return b, nil
}

func tlsShow(o showOpts, stdout io.Writer) error {
	data, err := readBounded(o.file)
	if err != nil {
		return err
	}
	certs, keys, err := parseCertsPEM(data)
	if err != nil {
		return fmt.Errorf("%s: %w", o.file, err)
	}
	if len(certs) == 0 {
		if keys > 0 {
			return fmt.Errorf("%s holds a private key, not a certificate (show the matching .pem)", o.file)
		}
		return fmt.Errorf("%s: no PEM certificate", o.file)
	}
	now := time.Now()
	for i, c := range certs {
		if len(certs) > 1 {
			fmt.Fprintf(stdout, "certificate %d of %d in %s\n", i+1, len(certs), o.file)
		}
		describeCert(stdout, c, now)
		if i < len(certs)-1 {
			fmt.Fprintln(stdout)
		}
	}
	if keys > 0 {
		fmt.Fprintf(stdout, "(%s also holds %d private key(s), not shown)\n", o.file, keys)
	}
	var problems []string
	leaf := certs[0]
	if o.name != "" {
		if got, err := identity.NameOf(leaf); err != nil {
			problems = append(problems, fmt.Sprintf("it proves no router name, want %q", o.name))
		} else if got != o.name {
			problems = append(problems, fmt.Sprintf("it proves router %q, want %q", got, o.name))
		}
	}
	if o.caFile != "" {
		if err := verifyAgainst(leaf, certs[1:], o.caFile, now); err != nil {
			problems = append(problems, err.Error())
		} else {
			fmt.Fprintf(stdout, "check:     signed by the CA in %s and valid now\n", o.caFile)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s: %s", o.file, strings.Join(problems, "; "))
	}
	return nil
}

// parseCertsPEM returns the certificates in data and counts its private
// keys. Other PEM blocks are skipped.
func parseCertsPEM(data []byte) ([]*x509.Certificate, int, error) {
	var certs []*x509.Certificate
	keys := 0
	for {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			return certs, keys, nil
		}
		switch {
		case blk.Type == "CERTIFICATE":
			if len(certs) == maxShowCerts {
				return nil, 0, fmt.Errorf("more than %d certificates", maxShowCerts)
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, 0, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
			}
			certs = append(certs, c)
		case strings.HasSuffix(blk.Type, "PRIVATE KEY"):
			keys++
		}
	}
}

// verifyAgainst checks leaf (with intermediates) against the CA certificates
// in caFile at now.
func verifyAgainst(leaf *x509.Certificate, inter []*x509.Certificate, caFile string, now time.Time) error {
	data, err := readBounded(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return fmt.Errorf("no PEM certificate in %s", caFile)
	}
	ip := x509.NewCertPool()
	for _, c := range inter {
		ip.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: ip, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("not valid under the CA in %s: %v", caFile, err)
	}
	return nil
}

// describeCert prints what an operator checks in a certificate. Every
// string from the certificate is escaped: it may come from anywhere.
func describeCert(w io.Writer, c *x509.Certificate, now time.Time) {
	router := "none: this certificate names no warmroute router (no " + identity.URNPrefix + "<name> URI SAN)"
	if name, err := identity.NameOf(c); err == nil {
		router = name
	} else if !errors.Is(err, identity.ErrNoName) {
		router = "none: " + err.Error()
	} else if c.IsCA {
		router = "none (a CA certificate)"
	}
	fmt.Fprintf(w, "router:    %s\n", clean(router))
	fmt.Fprintf(w, "subject:   %s\n", clean(c.Subject.String()))
	fmt.Fprintf(w, "issuer:    %s\n", clean(c.Issuer.String()))
	if c.IsCA {
		fmt.Fprintf(w, "CA:        yes\n")
	}
	var uris []string
	for _, u := range c.URIs {
		uris = append(uris, u.String())
	}
	var ips []string
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	fmt.Fprintf(w, "URIs:      %s\n", cleanList(uris))
	fmt.Fprintf(w, "DNS names: %s\n", cleanList(c.DNSNames))
	fmt.Fprintf(w, "IPs:       %s\n", cleanList(ips))
	state := ""
	switch {
	case now.Before(c.NotBefore):
		state = "NOT YET VALID"
	case !now.Before(c.NotAfter):
		state = "EXPIRED"
	default:
		state = fmt.Sprintf("%d days left", int(c.NotAfter.Sub(now).Hours()/24))
	}
	fmt.Fprintf(w, "valid:     %s to %s (%s)\n", c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339), state)
	var usage []string
	for _, u := range c.ExtKeyUsage {
		switch u {
		case x509.ExtKeyUsageServerAuth:
			usage = append(usage, "server")
		case x509.ExtKeyUsageClientAuth:
			usage = append(usage, "client")
		case x509.ExtKeyUsageAny:
			usage = append(usage, "any")
		default:
			usage = append(usage, "other("+strconv.Itoa(int(u))+")")
		}
	}
	if len(usage) > 0 {
		fmt.Fprintf(w, "usage:     %s\n", strings.Join(usage, ", "))
	}
	fp := sha256.Sum256(c.Raw)
	fmt.Fprintf(w, "serial:    %s\n", c.SerialNumber.Text(16))
	fmt.Fprintf(w, "sha256:    %s\n", hex.EncodeToString(fp[:]))
}

func cleanList(v []string) string {
	if len(v) == 0 {
		return "-"
	}
	out := make([]string, len(v))
	for i, s := range v {
		out[i] = clean(s)
	}
	return strings.Join(out, ", ")
}

// clean escapes control and non-printable characters so a hostile
// certificate cannot write to the terminal.
func clean(s string) string {
	if strings.IndexFunc(s, notPrintable) < 0 {
		return s
	}
	q := strconv.QuoteToGraphic(s)
	return q[1 : len(q)-1]
}

// revokeOpts are the settings of 'tls revoke' and 'tls unrevoke'.
type revokeOpts struct {
	names, serials, certs []string
	list                  bool
	output                string
}

// maxRevokeArgs bounds the names, serial numbers and files of one
// 'tls revoke'.
const maxRevokeArgs = 1000

func parseRevoke(args []string, unrevoke bool, stderr io.Writer) (revokeOpts, adminOpts, error) {
	var o revokeOpts
	verb := "revoke"
	if unrevoke {
		verb = "unrevoke"
	}
	fs := flag.NewFlagSet("warmroute tls "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	ao := adminFlags(fs)
	fs.Var(multiFlag{&o.names}, "name", "router name whose every certificate is "+verb+"d (repeat, or a comma-separated list)")
	fs.Var(multiFlag{&o.serials}, "serial", "certificate serial number, hex as 'warmroute tls show' prints it (repeatable)")
	fs.Var(multiFlag{&o.certs}, "cert", "certificate file whose serial number is "+verb+"d (repeatable)")
	if !unrevoke {
		fs.BoolVar(&o.list, "list", false, "print the cluster's revocation list instead")
	}
	output := outputFlag(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: warmroute tls %[1]s [--name ROUTER]... [--serial HEX]... [--cert FILE]... [admin flags]
       warmroute tls revoke --list [admin flags]

%[2]s
the cluster's revocation list, through any router's admin API (the write
needs the admin token from another host; it is forwarded to the Raft
leader). The list is agreed through Raft: once committed, every router
refuses a certificate that names a revoked router or carries a revoked serial
number, in every TLS handshake (Raft, admin forwarding), every Raft request
on a connection opened before, and every gossip signature, and the leader
removes a revoked router from the Raft configuration. Revoke by --name to
retire a router for good, by --serial (or --cert) to end one certificate
while the router gets a new one. Every router must run a version that knows
revocations.

`, verb, map[bool]string{false: "Add router names and certificate serial numbers to", true: "Take router names and certificate serial numbers off"}[unrevoke])
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return o, ao, err
	}
	o.output = *output
	if len(pos) > 0 {
		return o, ao, usageErrorf("tls %s: unexpected arguments %q (names go in --name)", verb, pos)
	}
	if err := checkOutput(o.output); err != nil {
		return o, ao, err
	}
	n := len(o.names) + len(o.serials) + len(o.certs)
	switch {
	case o.list && n > 0:
		return o, ao, usageErrorf("tls revoke --list takes no --name, --serial or --cert")
	case !o.list && n == 0:
		return o, ao, usageErrorf("tls %s: give --name, --serial or --cert (or --list to see the list)", verb)
	case n > maxRevokeArgs:
		return o, ao, usageErrorf("tls %s: at most %d names, serial numbers and files at once", verb, maxRevokeArgs)
	}
	for _, name := range o.names {
		if err := identity.CheckName(name); err != nil {
			return o, ao, usageErrorf("--name: %w", err)
		}
	}
	for i, v := range o.serials {
		c, err := identity.CanonicalSerial(v)
		if err != nil {
			return o, ao, usageErrorf("--serial: %w", err)
		}
		o.serials[i] = c
	}
	return o, ao, nil
}

// tlsRevoke runs 'tls revoke' and 'tls unrevoke'.
func tlsRevoke(ctx context.Context, unrevoke bool, args []string, stdout, stderr io.Writer) error {
	o, ao, err := parseRevoke(args, unrevoke, stderr)
	if err != nil {
		return err
	}
	// The serial numbers of --cert files, read before anything is sent.
	for _, f := range o.certs {
		data, err := readBounded(f)
		if err != nil {
			return err
		}
		certs, _, err := parseCertsPEM(data)
		if err != nil || len(certs) == 0 {
			return fmt.Errorf("--cert %s: no PEM certificate (%v)", f, err)
		}
		o.serials = append(o.serials, identity.Serial(certs[0]))
	}
	c, err := newAdminClient(ao)
	if err != nil {
		return err
	}
	if o.list {
		list, err := c.Revocations(ctx)
		if err != nil {
			return err
		}
		if o.output == "json" {
			return printJSON(stdout, list)
		}
		fmt.Fprintf(stdout, "epoch %d\n\n", list.Epoch)
		tw := newTable(stdout)
		fmt.Fprintln(tw, "REVOKED\tVALUE")
		for _, n := range list.Names {
			fmt.Fprintf(tw, "name\t%s\n", n)
		}
		for _, s := range list.Serials {
			fmt.Fprintf(tw, "serial\t%s\n", s)
		}
		return tw.Flush()
	}
	req := admin.RevocationRequest{Names: o.names, Serials: o.serials}
	var res admin.WriteResult
	if unrevoke {
		res, err = c.Unrevoke(ctx, req)
	} else {
		res, err = c.Revoke(ctx, req)
	}
	if err != nil {
		return err
	}
	return printJSON(stdout, res)
}
