//go:build race

package saar

const raceEnabled = true
