// Command tlogcheck verifies a ckpt-audit tlog-proof@v1 file with Go's own transparency-log code
// (golang.org/x/mod/sumdb/note and golang.org/x/mod/sumdb/tlog), which no one on this project
// wrote: the checkpoint's signature with note.Open and the inclusion proof with tlog.CheckRecord.
//
//	tlogcheck VKEY PROOF_FILE
//
// Exit 0 and one "ok" line when both verify, 1 with the reason otherwise, 2 for bad usage.
// Built with GO111MODULE=off GOPATH=/usr/share/gocode against Debian's golang-golang-x-mod-dev
// (tests/interop/go_crosscheck.sh; docs/interop.md).
package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type proof struct {
	entry      []byte
	index      int64
	path       tlog.RecordProof
	checkpoint []byte
}

// parseProof reads the c2sp.org/tlog-proof@v1 text: header, optional extra, index, hashes,
// an empty line, then the checkpoint verbatim.
func parseProof(text []byte) (*proof, error) {
	p := &proof{}
	rest := text
	next := func() (string, bool) {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return "", false
		}
		line := string(rest[:i])
		rest = rest[i+1:]
		return line, true
	}
	line, ok := next()
	if !ok || line != "c2sp.org/tlog-proof@v1" {
		return nil, errors.New("not a c2sp.org/tlog-proof@v1 proof")
	}
	line, ok = next()
	if ok && strings.HasPrefix(line, "extra ") {
		extra, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(line, "extra "))
		if err != nil {
			return nil, fmt.Errorf("extra: %v", err)
		}
		p.entry = extra
		line, ok = next()
	}
	if !ok || !strings.HasPrefix(line, "index ") {
		return nil, errors.New("missing index line")
	}
	index, err := strconv.ParseInt(strings.TrimPrefix(line, "index "), 10, 64)
	if err != nil || index < 0 {
		return nil, fmt.Errorf("bad index %q", line)
	}
	p.index = index
	for {
		line, ok = next()
		if !ok {
			return nil, errors.New("missing the empty line before the checkpoint")
		}
		if line == "" {
			break
		}
		h, err := tlog.ParseHash(line)
		if err != nil {
			return nil, fmt.Errorf("proof hash %q: %v", line, err)
		}
		p.path = append(p.path, h)
	}
	p.checkpoint = rest
	return p, nil
}

// checkpointBody reads origin, size and root hash from a verified note's text.
func checkpointBody(text string) (origin string, size int64, root tlog.Hash, err error) {
	lines := strings.SplitN(text, "\n", 4)
	if len(lines) < 4 {
		return "", 0, root, errors.New("checkpoint body is not origin, size, root hash")
	}
	size, err = strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 {
		return "", 0, root, fmt.Errorf("checkpoint size %q", lines[1])
	}
	root, err = tlog.ParseHash(lines[2])
	if err != nil {
		return "", 0, root, fmt.Errorf("checkpoint root: %v", err)
	}
	return lines[0], size, root, nil
}

func check(vkey string, proofText []byte) (string, error) {
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		return "", fmt.Errorf("verifier key: %v", err)
	}
	p, err := parseProof(proofText)
	if err != nil {
		return "", err
	}
	if p.entry == nil {
		return "", errors.New("proof carries no entry (extra line)")
	}
	n, err := note.Open(p.checkpoint, note.VerifierList(verifier))
	if err != nil {
		return "", fmt.Errorf("checkpoint: %v", err)
	}
	origin, size, root, err := checkpointBody(n.Text)
	if err != nil {
		return "", err
	}
	if origin != verifier.Name() {
		return "", fmt.Errorf("checkpoint origin %q is not the key's name %q", origin, verifier.Name())
	}
	if p.index >= size {
		return "", fmt.Errorf("index %d outside tree of size %d", p.index, size)
	}
	if err := tlog.CheckRecord(p.path, size, root, p.index, tlog.RecordHash(p.entry)); err != nil {
		return "", fmt.Errorf("inclusion: %v", err)
	}
	return fmt.Sprintf("ok: entry %d of %s is in the tree of size %d signed by %s",
		p.index, origin, size, verifier.Name()), nil
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: tlogcheck VKEY PROOF_FILE")
		os.Exit(2)
	}
	text, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	msg, err := check(os.Args[1], text)
	if err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	fmt.Println(msg)
}
