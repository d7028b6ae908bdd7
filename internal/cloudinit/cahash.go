package cloudinit

import (
	"bytes"
	"crypto/sha1"
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"
)

// subjectHash is OpenSSL's name for a CA certificate in a hashed directory
// such as /etc/ssl/certs (`openssl x509 -hash`, the HASH of its HASH.0
// link), computed here so that guest/ca-certs need not start openssl in
// the guest: a second or more of every start under TCG, on the way to a
// new VM's first session.
//
// It is X509_NAME_hash_ex of OpenSSL 1.0 and later (crypto/x509/x_name.c):
// the first four bytes of the SHA-1 of the subject's canonical encoding,
// read little-endian. The canonical encoding is the subject's RDNs, each
// a DER SET of its attributes, concatenated without the outer SEQUENCE;
// each string value of the types asn1_string_canon folds is turned into
// UTF-8, stripped of leading and trailing whitespace, its runs of
// whitespace made one space and its ASCII letters lowercased, and encoded
// as a UTF8String; other values stay as they are.
func subjectHash(certPEM string) (string, error) {
	block, _ := pem.Decode([]byte(certPEM))
	if block == nil || block.Type != "CERTIFICATE" {
		return "", errors.New("not a PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", err
	}
	var rdns []attributesSET
	if rest, err := asn1.Unmarshal(cert.RawSubject, &rdns); err != nil {
		return "", fmt.Errorf("the certificate's subject: %w", err)
	} else if len(rest) > 0 {
		return "", errors.New("the certificate's subject: trailing data")
	}
	var canon []byte
	for _, rdn := range rdns {
		var attrs [][]byte
		for _, a := range rdn {
			v := a.Value
			s, folded, err := canonString(v)
			if err != nil {
				return "", fmt.Errorf("the certificate's subject: %w", err)
			}
			if folded {
				v = asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagUTF8String, Bytes: s}
			}
			enc, err := asn1.Marshal(struct {
				Type  asn1.ObjectIdentifier
				Value asn1.RawValue
			}{a.Type, asn1.RawValue{Class: v.Class, Tag: v.Tag, IsCompound: v.IsCompound, Bytes: v.Bytes}})
			if err != nil {
				return "", err
			}
			attrs = append(attrs, enc)
		}
		// DER orders a SET OF by the elements' encodings.
		slices.SortFunc(attrs, bytes.Compare)
		set, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSet, IsCompound: true, Bytes: bytes.Join(attrs, nil)})
		if err != nil {
			return "", err
		}
		canon = append(canon, set...)
	}
	sum := sha1.Sum(canon)
	return fmt.Sprintf("%08x", binary.LittleEndian.Uint32(sum[:4])), nil
}

// attributesSET is one RDN of a name: a SET of attributes.
type attributesSET []struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue
}

// canonString is v's value as asn1_string_canon leaves it, for the string
// types it folds (ASN1_MASK_CANON); folded is false for any other. A
// value OpenSSL could not turn into UTF-8 is an error.
func canonString(v asn1.RawValue) (s []byte, folded bool, err error) {
	if v.Class != asn1.ClassUniversal || v.IsCompound {
		return nil, false, nil
	}
	var runes []rune
	width := 0
	switch v.Tag {
	case asn1.TagUTF8String:
		if !utf8.Valid(v.Bytes) {
			return nil, false, errors.New("a UTF8String that is not UTF-8")
		}
		runes = []rune(string(v.Bytes))
	case asn1.TagPrintableString, asn1.TagT61String, asn1.TagIA5String, tagVisibleString:
		width = 1 // one byte a character (T61 read as Latin-1, as OpenSSL does)
	case asn1.TagBMPString:
		width = 2
	case tagUniversalString:
		width = 4
	default:
		return nil, false, nil
	}
	if width > 0 {
		if len(v.Bytes)%width != 0 {
			return nil, false, fmt.Errorf("a string of %d bytes, not of whole %d-byte characters", len(v.Bytes), width)
		}
		for i := 0; i < len(v.Bytes); i += width {
			var r rune
			for _, b := range v.Bytes[i : i+width] { // big-endian
				r = r<<8 | rune(b)
			}
			if !utf8.ValidRune(r) {
				return nil, false, fmt.Errorf("character %#x has no UTF-8", r)
			}
			runes = append(runes, r)
		}
	}
	u := []byte(string(runes))
	for len(u) > 0 && isSpace(u[0]) {
		u = u[1:]
	}
	for len(u) > 0 && isSpace(u[len(u)-1]) {
		u = u[:len(u)-1]
	}
	out := make([]byte, 0, len(u))
	for i := 0; i < len(u); i++ {
		c := u[i]
		switch {
		case isSpace(c):
			out = append(out, ' ')
			for i+1 < len(u) && isSpace(u[i+1]) {
				i++
			}
		case 'A' <= c && c <= 'Z':
			out = append(out, c+'a'-'A')
		default:
			out = append(out, c) // the rest, and every byte of a non-ASCII character, as it is
		}
	}
	return out, true, nil
}

// The ASN.1 string tags encoding/asn1 has no names for.
const (
	tagVisibleString   = 26
	tagUniversalString = 28
)

// isSpace is ossl_isspace: space, \t, \n, \v, \f, \r.
func isSpace(c byte) bool { return c == ' ' || '\t' <= c && c <= '\r' }
