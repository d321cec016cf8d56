#!/bin/bash
. /tmp/fix45-pg/env.sh
S=/tmp/probe45-f/small
t() { echo "--- KB_AGENT_STORE=$1 :: ${@:2}"; KB_AGENT_STORE="$1" timeout 60 .venv/bin/python -m crag "${@:2}" 2>&1 | head -5; echo "rc=${PIPESTATUS[0]}"; }
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/nosuchdb' index $S
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/nosuchdb' search cors
t 'postgresql://crag:WrongPassXYZ@127.0.0.1:18650/kb1' search cors
t 'postgresql://crag:WrongPassXYZ@127.0.0.1:18650/kb1' index $S
t 'postgresql://crag:WrongPassXYZ@127.0.0.1:18650/kb1' ask "what is cors"
t 'postgresql://crag@127.0.0.1:18650/kb1?password=WrongPassXYZ' search cors
t 'postgresql://nocreate:npw@127.0.0.1:18650/kbnoc' index $S
t 'postgresql://nocreate:npw@127.0.0.1:18650/kbnoc' search cors
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/kbnoext' index $S
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/kb3' search cors
t 'postgresql://crag:S3cretPW@127.0.0.1:18651/kb1' search cors
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/kb1?sslmod=require' search cors
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/kb1?sslmode=require' search cors
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/kb1?sslmode=disable' search cors
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/kb1?sslmode=bogus' search cors
t 'postgresql://crag:S3%zzcretPW@127.0.0.1:18650/kb1' search cors
t 'postgresql://crag:S3cretPW@[::1:18650/kb1' search cors
t 'postgresql://crag:S3cretPW@[::1]:18650/kb1' search cors
t 'postgresql://crag:p@ss/w:rd@127.0.0.1:18650/kb1' search cors
t 'postgresql://weird:p%40ss%2Fw%3Ard%23%3F%25x@127.0.0.1:18650/kbweird' index $S
t 'postgresql://weird:p%40ss%2Fw%3Ard%23%3F%25x@[::1]:18650/kbweird' search cors
t 'postgresql:///kb1?host=/tmp/probe45-f/pg&port=18650&user=crag' roots
t 'postgresql://crag@%2Ftmp%2Fprobe45-f%2Fpg:18650/kb1' roots
t 'postgres://crag:S3cretPW@127.0.0.1:18650/kb1' roots
t 'postgresql://crag:S3cretPW@127.0.0.1:18650/kb1?connect_timeout=2&application_name=x' roots
