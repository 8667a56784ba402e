# frozen_string_literal: true

# The Sidekiq application the relay tests run with a real `sidekiq` server (Debian's
# ruby-sidekiq). Each run appends "<jid> <idempotency key> <args as JSON>" to RELAY_EFFECTS.
# With CRONKEEPER_MIDDLEWARE=1 it loads contrib/sidekiq/cronkeeper_middleware.rb, as the docs
# tell a team to.

require "json"
require "sidekiq"

if ENV["CRONKEEPER_MIDDLEWARE"] == "1"
  require_relative "../../contrib/sidekiq/cronkeeper_middleware"
end

# Poll the schedule set every second (the default averages 5 s per process), so a test of a
# scheduled job waits less; the behaviour is Sidekiq's own.
Sidekiq.configure_server do |config|
  if config.respond_to?(:average_scheduled_poll_interval=)
    config.average_scheduled_poll_interval = 1
  else
    config[:average_scheduled_poll_interval] = 1
  end
end

module Effects
  def self.append(line)
    File.open(ENV.fetch("RELAY_EFFECTS"), "a") { |f| f.write("#{line}\n") }
  end
end

class RecordJob
  include Sidekiq::Worker

  def perform(*args)
    sleep(args.first["sleep"].to_f) if args.first.is_a?(Hash) && args.first["sleep"]
    Effects.append("#{jid} #{args.to_json}")
  end
end

class FailJob
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform(*args)
    raise "failed on purpose: #{args.to_json}"
  end
end
