package guest

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// subjectHash is OpenSSL's X509_NAME_hash (the "subject_hash" that names
// the files in a hashed certificate directory): the first four bytes,
// little-endian, of the SHA-1 of the name's canonical encoding. OpenSSL's
// canonical encoding turns every string attribute into a UTF8String with
// surrounding space dropped, inner runs of space collapsed and ASCII
// lower-cased, and leaves out the outer SEQUENCE header. Init needs it
// because it writes the hashed directory without the openssl tool.
func subjectHash(rawSubject []byte) (uint32, error) {
	in := cryptobyte.String(rawSubject)
	var rdns cryptobyte.String
	if !in.ReadASN1(&rdns, cbasn1.SEQUENCE) || !in.Empty() {
		return 0, errors.New("parsing subject: not a SEQUENCE")
	}
	var canon []byte
	for !rdns.Empty() {
		var set cryptobyte.String
		if !rdns.ReadASN1(&set, cbasn1.SET) {
			return 0, errors.New("parsing subject: not a SET")
		}
		var atvs [][]byte
		for !set.Empty() {
			var atv, oid, value cryptobyte.String
			var tag cbasn1.Tag
			if !set.ReadASN1(&atv, cbasn1.SEQUENCE) ||
				!atv.ReadASN1Element(&oid, cbasn1.OBJECT_IDENTIFIER) ||
				!atv.ReadAnyASN1Element(&value, &tag) {
				return 0, errors.New("parsing subject: bad attribute")
			}
			var b cryptobyte.Builder
			b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
				b.AddBytes(oid)
				if s, ok := canonString(value, tag); ok {
					b.AddASN1(cbasn1.UTF8String, func(b *cryptobyte.Builder) { b.AddBytes([]byte(s)) })
				} else {
					b.AddBytes(value)
				}
			})
			enc, err := b.Bytes()
			if err != nil {
				return 0, err
			}
			atvs = append(atvs, enc)
		}
		// DER orders a SET OF by its elements' encodings.
		slices.SortFunc(atvs, bytes.Compare)
		var b cryptobyte.Builder
		b.AddASN1(cbasn1.SET, func(b *cryptobyte.Builder) {
			for _, a := range atvs {
				b.AddBytes(a)
			}
		})
		enc, err := b.Bytes()
		if err != nil {
			return 0, err
		}
		canon = append(canon, enc...)
	}
	sum := sha1.Sum(canon)
	return binary.LittleEndian.Uint32(sum[:4]), nil
}

// canonString decodes a string attribute's value (a whole element) and
// canonicalizes it as OpenSSL's asn1_string_canon does; ok is false for
// types OpenSSL leaves as they are.
func canonString(elem cryptobyte.String, tag cbasn1.Tag) (string, bool) {
	var v cryptobyte.String
	if !elem.ReadASN1(&v, tag) {
		return "", false
	}
	var s string
	switch tag {
	case cbasn1.UTF8String, cbasn1.PrintableString, cbasn1.IA5String, 26 /* VisibleString */ :
		s = string(v)
	case 20: // T61String: OpenSSL reads it as Latin-1
		r := make([]rune, len(v))
		for i, c := range v {
			r[i] = rune(c)
		}
		s = string(r)
	case 30: // BMPString: UCS-2, big-endian
		u := make([]uint16, len(v)/2)
		for i := range u {
			u[i] = binary.BigEndian.Uint16(v[2*i:])
		}
		s = string(utf16.Decode(u))
	case 28: // UniversalString: UCS-4, big-endian
		var r []rune
		for i := 0; i+4 <= len(v); i += 4 {
			r = append(r, rune(binary.BigEndian.Uint32(v[i:])))
		}
		s = string(r)
	default:
		return "", false
	}
	if !utf8.ValidString(s) {
		return "", false
	}
	// Space is OpenSSL's ossl_isspace: ASCII space, \t \n \v \f \r.
	isSpace := func(c byte) bool { return c == ' ' || ('\t' <= c && c <= '\r') }
	s = strings.TrimFunc(s, func(r rune) bool { return r < 0x80 && isSpace(byte(r)) })
	var out []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 0x80:
			out = append(out, c)
		case isSpace(c):
			for i+1 < len(s) && isSpace(s[i+1]) {
				i++
			}
			out = append(out, ' ')
		case 'A' <= c && c <= 'Z':
			out = append(out, c+'a'-'A')
		default:
			out = append(out, c)
		}
	}
	return string(out), true
}
