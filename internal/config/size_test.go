package config

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
	}{
		{"0", 0},
		{"1", 1},
		{"512B", 512},
		{"1KiB", 1 << 10},
		{"1K", 1 << 10},
		{"1KB", 1000},
		{"512MiB", 512 << 20},
		{"512M", 512 << 20},
		{"512MB", 512e6},
		{"1GiB", 1 << 30},
		{"2G", 2 << 30},
		{"2GB", 2e9},
		{"1TiB", 1 << 40},
		{"1T", 1 << 40},
		{"1TB", 1e12},
		{"1gib", 1 << 30},
		{"1 GiB", 1 << 30},
		{" 4GiB ", 4 << 30},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	if got, err := ParseSize("18446744073709551615"); err != nil || got != math.MaxUint64 {
		t.Errorf("ParseSize(max) = %d, %v", got, err)
	}
}

func TestParseSizeErrors(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", `"" is not a size; write e.g. "512MiB" or "2GiB"`},
		{"1 gigabyte", `"1 gigabyte" is not a size; write e.g. "512MiB" or "2GiB"`},
		{"GiB", `"GiB" is not a size`},
		{"-1GiB", `"-1GiB" is not a size`},
		{"+1GiB", `"+1GiB" is not a size`},
		{"1.5GiB", `"1.5GiB" is not a size; sizes are whole numbers; write e.g. "1536MiB" instead of "1.5GiB"`},
		{"1,5G", `sizes are whole numbers`},
		{"1EiB", `"1EiB" is not a size`},
		{"1GiBs", `"1GiBs" is not a size`},
		{"0x10", `"0x10" is not a size`},
		{"1e9", `"1e9" is not a size`},
		{"16777216TiB", `"16777216TiB" is too large`},
		{"18446744073709551616", `is too large`},
		{"99999999999999999999999GiB", `is too large`},
	}
	for _, tt := range tests {
		_, err := ParseSize(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseSize(%q) = %v, want error containing %q", tt.in, err, tt.want)
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseSize(%q): errors.Is(ErrInvalid) = false", tt.in)
		}
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		in   uint64
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1000, "1000B"},
		{1 << 10, "1KiB"},
		{1536, "1536B"},
		{512 << 20, "512MiB"},
		{1536 << 20, "1536MiB"},
		{1 << 30, "1GiB"},
		{4 << 30, "4GiB"},
		{1 << 40, "1TiB"},
		{2e9, "1953125KiB"},
	}
	for _, tt := range tests {
		if got := FormatSize(tt.in); got != tt.want {
			t.Errorf("FormatSize(%d) = %q, want %q", tt.in, got, tt.want)
		}
		if back, err := ParseSize(FormatSize(tt.in)); err != nil || back != tt.in {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", tt.in, back, err)
		}
	}
}

func TestParseIdle(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr string
	}{
		{"off", 0, ""},
		{"1m", time.Minute, ""},
		{"60s", time.Minute, ""},
		{"30m", 30 * time.Minute, ""},
		{"2h", 2 * time.Hour, ""},
		{"59s", 0, "shorter than the minimum of 1m"},
		{"0", 0, "shorter than the minimum of 1m"},
		{"-5m", 0, "shorter than the minimum of 1m"},
		{"Off", 0, "is not a duration"},
		{"", 0, "is not a duration"},
		{"30", 0, "is not a duration"},
		{"never", 0, "is not a duration"},
	}
	for _, tt := range tests {
		got, err := parseIdle(tt.in)
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("parseIdle(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("parseIdle(%q) = %v; want error containing %q", tt.in, err, tt.wantErr)
		}
	}
}
